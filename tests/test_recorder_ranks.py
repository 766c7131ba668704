"""Rank identity: the header's ranks and widths, and one run id for every rank of a server start.

The real path: a launcher process loads the plugins with sglang's own
``load_plugins()``, then starts two ranks with multiprocessing's spawn
context, as sglang does; each rank loads the plugins again, publishes its
placement through sglang's runtime context and records through the
recorder the plugin built. Nothing but the environment connects them.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.names import CONTROL_FILE_ENV, DIR_ENV, RUN_ID_ENV
from schedtrace.tracer.kernel_stub import STUB_DIR
from schedtrace.tracer.recorder.naming import HOST_LIMIT, ensure_run_id, safe_name, trace_stem
from schedtrace.tracer.recorder.ranks import ranks_of

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "tracer" / "sandbox" / "assets" / "tiny-llama"

LAUNCHER = textwrap.dedent(
    """
    import json, multiprocessing, os, sys
    from types import SimpleNamespace

    def rank(world_rank, model, queue):
        from sglang.srt.plugins import load_plugins
        load_plugins()  # run_scheduler_process does this first, before publishing the ranks
        from sglang.srt.runtime_context import SpawnRanks, publish
        from sglang.srt.server_args import ServerArgs
        from schedtrace.tracer import plugin
        from schedtrace.tracer.recorder.ranks import read_ranks
        from schedtrace.testing.rig import RealPools, server_args
        unpublished = read_ranks(SimpleNamespace(tp_rank=world_rank, tp_size=2))  # the scheduler's own
        args = ServerArgs(model_path=model, tp_size=2, device="cpu")
        publish(args, role="scheduler", ranks=SpawnRanks(world_rank=world_rank))
        pools = RealPools(server_args(), 4)
        scheduler = SimpleNamespace(server_args=args, token_to_kv_pool_allocator=pools.allocator,
                                    tree_cache=pools.tree_cache, req_to_token_pool=pools.req_to_token_pool)
        rec = plugin._recorder
        rec.attach(scheduler)
        rec.close()  # an idle-only run still leaves its trace
        queue.put({"pid": os.getpid(), "path": str(rec.writer.paths[0]), "unpublished": [unpublished["tp_rank"], unpublished["tp_size"]]})

    if __name__ == "__main__":
        from sglang.srt.plugins import load_plugins
        load_plugins()  # the launcher loads the plugins before it starts any rank
        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        ranks = [context.Process(target=rank, args=(n, sys.argv[1], queue)) for n in range(2)]
        for p in ranks:
            p.start()
        reports = []
        while len(reports) < len(ranks):
            try:
                reports.append(queue.get(timeout=2))
            except Exception:  # nothing yet: a rank that died says so instead of a long wait
                dead = [p.exitcode for p in ranks if p.exitcode not in (None, 0)]
                if dead:
                    sys.exit(f"a rank exited with {dead[0]}")
        for p in ranks:
            p.join(60)
        print(json.dumps({"run_id": os.environ.get(sys.argv[2]), "pid": os.getpid(), "ranks": reports}))
    """
)


def launch(tmp_path: Path) -> dict:
    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER)
    env = {k: v for k, v in os.environ.items() if k not in ("SGLANG_PLUGINS", RUN_ID_ENV, CONTROL_FILE_ENV)}
    env[DIR_ENV] = str(tmp_path / "traces")
    # sglang processes on CPU get the sgl_kernel stand-in as the sandbox's do: its sitecustomize first.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(STUB_DIR), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, str(script), str(MODEL), RUN_ID_ENV], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_two_spawned_ranks_share_the_launchers_run_id_and_record_their_ranks(tmp_path: Path) -> None:
    out = launch(tmp_path)
    run_id = out["run_id"]
    assert run_id
    headers = {}
    for report in out["ranks"]:
        path = Path(report["path"])
        with TraceReader(path) as reader:
            h = reader.header
        headers[h.tp_rank] = h
        assert h.run_id == run_id  # the same id, though the ranks never talked
        assert h.pid == report["pid"] != out["pid"]
        assert (h.tp_size, h.pp_rank, h.pp_size, h.dp_rank, h.dp_size) == (2, 0, 1, None, 1)
        assert (h.attn_tp_rank, h.attn_tp_size, h.attn_dp_rank, h.attn_dp_size) == (h.tp_rank, 2, None, 1)
        host = safe_name(socket.gethostname(), HOST_LIMIT)
        assert path.name == f"schedtrace-{run_id}-{host}-tp{h.tp_rank}-dp0-pp0-pid{h.pid}.part000.trace"
        # Before publish, the ranks come from the scheduler's own attributes.
        assert report["unpublished"] == [h.tp_rank, 2]
    assert sorted(headers) == [0, 1]


def test_each_start_gets_its_own_run_id_and_children_inherit_it() -> None:
    first, second = {}, {}
    assert ensure_run_id(first) != ensure_run_id(second)  # two launchers, two runs
    child = dict(first)
    assert ensure_run_id(child) == first[RUN_ID_ENV]  # a rank started from the first launcher


def test_an_operator_set_run_id_is_kept_made_safe_for_file_names() -> None:
    environ = {RUN_ID_ENV: "bench 7/node a"}  # one id for the launchers of every node
    assert ensure_run_id(environ) == "bench_7_node_a" == environ[RUN_ID_ENV]


def test_the_stem_names_every_rank_and_width_it_needs() -> None:
    ranks = ranks_of(tp_rank=3, tp_size=4, dp_rank=1, dp_size=2, pp_rank=1, pp_size=2)
    assert trace_stem("r1", ranks, 77, host="gpu node/1") == "schedtrace-r1-gpu_node_1-tp3-dp1-pp1-pid77"
    assert trace_stem("", ranks_of(), 5, host="h") == "schedtrace-h-tp0-dp0-pp0-pid5"
