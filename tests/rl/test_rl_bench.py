"""The GRPO benchmark's runner on the CPU (`tik-evo bench rl`): every arm's steps recorded with their
phases, ratios and rewards, a summary and a markdown report, and bad arguments refused by name."""

import json

from tik_evo.rl import bench


def test_runner_writes_every_arms_steps_and_a_summary(tmp_path, capsys):
    out = tmp_path / "rl" / "grpo.json"
    rc = bench.main(["--model", "tiny", "--arms", "A,B,C", "--steps", "2", "--prompts", "1", "--group", "2",
                     "--digits", "1", "--max-new", "2", "--micro-batch", "2", "--lr", "1e-3", "--sft-steps", "1",
                     "--device", "cpu", "--profile", "--out", str(out)])
    assert rc == 0, capsys.readouterr().out
    rec = json.loads(out.read_text())
    assert rec["kind"] == "rl_grpo" and not rec["timed"] and rec["shape"]["max_pos"] == 4 + 3  # a 2-digit sum and EOS
    assert set(rec["arms"]) == {"A", "B", "C"}
    for arm in rec["arms"].values():
        assert [s["step"] for s in arm["steps"]] == [1, 2] and len(arm["sft_loss"]) == 1 and arm["notes"]
        assert all(set(s["times_s"]) == {"rollout", "recompute", "update", "other"} for s in arm["steps"])
        assert all(s["tokens"]["generated"] == s["ratio_all"]["tokens"] > 0 for s in arm["steps"])
    summary = rec["summary"]
    assert summary["skip"] == 1 and summary["arms"]["B"]["steps_timed"] == 1
    assert summary["arms"]["B"]["ratios_exactly_one_every_step"]
    assert summary["arms"]["A"]["mean_phase_s"]["recompute"] > 0 and summary["B_over_A_throughput"] is not None
    md = out.with_suffix(".md").read_text()
    assert "No speed figures" in md and "| B |" in md and "exactly 1.0 every step" in md
    # --profile: one more step of each arm under the profiler, outside the steps timed
    for name, arm in rec["arms"].items():
        prof = arm["profile"]
        assert prof["wall_ms"] > 0 and prof["kernel_ms"] is None and prof["top_host_ops"], name
        assert f"- {name}, one profiled step: wall" in md
    assert rec["packed_backward"] == {"setting": "auto", "ran": "sdpa_per_sequence"}  # no GPU: no varlen flash


def test_runner_refuses_bad_arguments(tmp_path, capsys):
    out = str(tmp_path / "x.json")
    assert bench.main(["--arms", "A,Z", "--device", "cpu", "--out", out]) == 2
    assert "subset of A, B, C" in capsys.readouterr().out
    assert bench.main(["--model", "gpt", "--device", "cpu", "--out", out]) == 2
    assert "model 'gpt'" in capsys.readouterr().out
    assert bench.main(["--set", "attention=nosuchset", "--device", "cpu", "--out", out]) == 2
    assert "nosuchset" in capsys.readouterr().out
    assert bench.main(["--end-fraction", "1.5", "--device", "cpu", "--out", out]) == 2
    assert "--end-fraction 1.5" in capsys.readouterr().out
    assert bench.main(["--staleness", "-1", "--device", "cpu", "--out", out]) == 2
    assert "--staleness -1" in capsys.readouterr().out
    assert not (tmp_path / "x.json").exists()


def test_parity_runs_each_seed_once_and_compares_the_arms(tmp_path, capsys):
    from tik_evo.rl import parity

    out = tmp_path / "parity"
    rl = ["--model", "tiny", "--arms", "A,C", "--steps", "2", "--prompts", "1", "--group", "2", "--digits", "1",
          "--max-new", "2", "--micro-batch", "2", "--device", "cpu"]
    assert parity.main(["--seeds", "0,1", "--window", "1", "--out", str(out), "--", *rl]) == 0
    summary = json.loads((out / "parity.json").read_text())
    assert summary["seeds"] == [0, 1] and set(summary["arms"]) == {"A", "C"}
    assert all(len(a["mean_curve"]) == 2 and len(a["final"]) == 2 for a in summary["arms"].values())
    assert summary["C_minus_A"]["stderr"] is not None and (out / "parity.png").stat().st_size > 0
    first = (out / "seed_0.json").read_text()
    capsys.readouterr()
    assert parity.main(["--seeds", "0,1", "--window", "1", "--out", str(out), "--", *rl]) == 0  # resumed: kept
    assert "seed_0.json is complete, kept" in capsys.readouterr().out and (out / "seed_0.json").read_text() == first
    assert parity.main(["--seeds", "0", "--out", str(out), "--", "--seed", "3"]) == 2
