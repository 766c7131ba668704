"""Widgets of the schedtrace browser."""
