"""`shard=I/N` (fp8eval.shard): shards partition an arm; the unsharded rerun sends nothing and summarises."""

from __future__ import annotations

import json
import time

import pytest
from conftest import last_path, run_cli, run_inprocess

from fp8eval import shard as shards

ARGS = ["engine=fake", "task=niah", "task.lengths=[256,512]", "task.depths=[0,50,100]", "task.needles_per_cell=4",
        "task.repeats=2", "+engine.engine_args.fake_fp8_error=0.5", "report=false"]
# Fields that describe one invocation rather than the result.
VOLATILE = {"wall_s", "requests_sent", "records", "engine_prefill", "records_io", "timing", "anatomy"}


def stable(summary: dict) -> dict:
    out = {k: v for k, v in summary.items() if k not in VOLATILE}
    out["arms"] = {name: {k: v for k, v in arm.items() if k not in VOLATILE}
                   for name, arm in summary["arms"].items()}
    return out


def test_parse_and_partition():
    assert shards.parse(None) is None and shards.parse("2/4") == (2, 4) and shards.parse(" 0 / 1 ") == (0, 1)
    for bad in ("4/4", "1", "a/b", "-1/3", "0/0"):
        with pytest.raises(shards.ShardError, match="I/N"):
            shards.parse(bad)
    ids = [f"s{i}" for i in range(200)]
    parts = [shards.mine(ids, (i, 4), key=str) for i in range(4)]
    assert sorted(x for part in parts for x in part) == sorted(ids) and all(parts)
    assert shards.shard_of("niah/512/50/0", 4) == shards.shard_of("niah/512/50/0", 4)


def test_four_shards_then_unsharded_equals_one_process(tmp_path):
    single = run_inprocess(tmp_path / "a", ARGS)
    sharded_dir = tmp_path / "b"
    per_shard = [run_inprocess(sharded_dir, [*ARGS, f"shard={i}/4"], f"shard{i}") for i in range(4)]
    assert sum(s["arms"]["fp8"]["requests_sent"] for s in per_shard) == single["arms"]["fp8"]["requests_sent"]
    assert all(s["shard"] == f"{i}/4" for i, s in enumerate(per_shard))
    merged = run_inprocess(sharded_dir, ARGS, "merged")
    assert merged["arms"]["fp8"]["requests_sent"] == merged["arms"]["bf16"]["requests_sent"] == 0
    assert stable(merged) == stable(single)
    assert single["recovery"]["overall"] < 100


def test_missing_shard_is_named(tmp_path):
    for i in (0, 1, 3):
        run_inprocess(tmp_path, [*ARGS, f"shard={i}/4"], f"shard{i}")
    with pytest.raises(shards.ShardError) as err:
        run_inprocess(tmp_path, ARGS, "merged")
    msg = str(err.value)
    assert "shards done 3 of 4; not done: 2/4 (" in msg and "0/4" not in msg and "shard=0/1" in msg
    whole = run_inprocess(tmp_path, [*ARGS, "shard=0/1"], "whole")  # one process finishes the rest
    assert whole["arms"]["fp8"]["requests_sent"] > 0
    assert run_inprocess(tmp_path, ARGS, "merged2")["arms"]["fp8"]["requests_sent"] == 0


@pytest.mark.slow  # five Python processes: 13-33 s on the 2-core box
def test_submitit_local_four_shards_in_parallel(tmp_path):
    """The documented command: `-m shard=0/4,...,3/4 hydra/launcher=submitit_local`, four processes writing
    one records store at once, then the plain command summarises with zero requests."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    t0 = time.perf_counter()
    sweep = tmp_path / "sweep"
    run_cli(tmp_path, ["-m", *ARGS, "shard=0/4,1/4,2/4,3/4", "hydra/launcher=submitit_local",
                       "hydra.launcher.timeout_min=5", f"hydra.sweep.dir={sweep}"])
    done = sorted(p.name for p in (tmp_path / "records" / "niah").glob("*.done"))
    assert len(done) == 8, done  # 4 shards x 2 arms
    merged = json.loads((last_path(run_cli(tmp_path, ARGS)) / "summary.json").read_text())
    single = run_inprocess(tmp_path / "single", ARGS)
    assert merged["arms"]["fp8"]["requests_sent"] == 0
    assert stable(merged) == stable(single)
    print(f"submitit_local round trip {time.perf_counter() - t0:.1f} s")


def test_a_larger_grid_after_shards_is_new_work_not_a_missing_shard(tmp_path):
    """NIAH lengths are selection keys (same arm, same records): after all shards of the small grid,
    an unsharded run of a larger grid sends only the new cells instead of refusing."""
    for i in range(2):
        run_inprocess(tmp_path, [*ARGS, f"shard={i}/2"], f"shard{i}")
    bigger = [a if not a.startswith("task.lengths=") else "task.lengths=[256,512,1024]" for a in ARGS]
    s = run_inprocess(tmp_path, bigger, "bigger")
    assert s["arms"]["fp8"]["requests_sent"] == 12  # 3 depths x 4 needles at the new length
