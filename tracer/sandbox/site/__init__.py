"""The sandbox server's ``sitecustomize`` folder (put first on ``PYTHONPATH``)."""
