"""bench/gpu.sh's table: every vs_trl.py result, the trainer's step (trainer_step.py) and its
whole step (trainer_whole.py) in a folder, into one JSON file and Markdown on stdout.

    python3 bench/gpu_summary.py FOLDER RESULTS.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

GIB = 2**30


def whole_table(whole: dict) -> str:
    """The whole step's passes, a row each: the worker's run_once, phase by phase."""
    first = whole["passes"][0]
    mem = f"; peak {whole['peak_memory'] / GIB:.1f} GiB" if whole.get("peak_memory") else ""
    lines = [
        f"\ntrainer whole step (`burnish trainer`'s pass, TrainerWorker.run_once; {whole['model']}, {whole['store']} store, publish to a "
        f"loopback stand-in for vLLM; {whole['calls']} recorded calls a pass -> {first['sequences']:.0f} sequences, {first['sampled']:.0f} sampled "
        f"tokens; checkpointing {whole['checkpointing']}, packed {whole['packed']}{mem}), seconds:\n",
        "| pass | whole | read | load | batch | step | save | record | publish |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in whole["passes"]:
        name = f"{p['pass']} (model built)" if p["pass"] == 1 else str(p["pass"])
        cells = [p[k] for k in ("wall_s", "read_s", "load_s", "batch_s", "step_s", "save_s", "record_s", "publish_s")]
        lines.append(f"| {name} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
    return "\n".join(lines)


def main() -> int:
    folder, results = Path(sys.argv[1]), Path(sys.argv[2])
    runs = {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("vs_trl-*.json"), key=lambda p: p.stat().st_mtime)}  # in the order run
    step_file = folder / "trainer_step.json"
    step = json.loads(step_file.read_text()) if step_file.exists() else None
    whole_file = folder / "trainer_whole.json"
    whole = json.loads(whole_file.read_text()) if whole_file.exists() else None
    results.write_text(json.dumps({"vs_trl": runs, "trainer_step": step, "trainer_whole": whole}, indent=2))
    first = next(iter(runs.values()), None)
    if first:
        b = first["burnish"]
        print(
            f"device {b.get('gpu', b['device'])}; torch {b['versions']['torch']}, transformers {b['versions']['transformers']}, "
            f"peft {b['versions']['peft']}, TRL {first['TRL'].get('trl')}; bf16 matmul peak {first['matmul_flops_per_s'] / 1e12:.0f} TFLOP/s\n"
        )
    print("| shape, prompt + completion (x16) | ckpt | side | s/step | tokens/s | GFLOP/step | share of peak | peak GiB |")
    print("|---|---|---|---|---|---|---|---|")
    summary = []
    for r in runs.values():
        a = r["args"]
        name = f"{a['model']}, {a['prompt_len']} + {a['completion_len']}"
        sides = [k for k in r if k.startswith("burnish")] + ["TRL"]  # vs_trl.py --ours-checkpointing: "burnish (selective)", ...
        for side in sides:
            x = r[side]
            flops = f"{x['flops'] / 1e9:,.0f}" if x.get("flops") else "-"
            share = f"{x['peak_share']:.0%}" if x.get("peak_share") is not None else "-"
            mem = f"{x['peak_memory'] / GIB:.1f}" if x.get("peak_memory") else "-"
            print(
                f"| {name if side == 'burnish' else ''} | {x.get('checkpointing', a['checkpointing'])} | {side} | {x['median_s']:.4f} | {x['tokens_per_s']:,.0f} | {flops} | {share} | {mem} |"
            )
        theirs = r["TRL"]
        for side in sides[:-1]:
            ours = r[side]
            memory = ours["peak_memory"] / theirs["peak_memory"] if ours.get("peak_memory") and theirs.get("peak_memory") else None
            drift = max(abs(p - q) for p, q in zip(ours["losses"], theirs["losses"]))
            ratio = r["ratio_tokens_per_s"] if side == "burnish" else ours["ratio_tokens_per_s"]
            label = f"burnish ({ours.get('checkpointing', a['checkpointing'])})" if side == "burnish" else side
            summary.append(
                f"{name}, {label}: / TRL tokens/s {ratio:.2f}"
                + (f", peak memory {memory:.2f}x TRL's" if memory else "")
                + f"; loss step 1 {ours['losses'][0]:+.6f} / {theirs['losses'][0]:+.6f}, largest |difference| over {len(ours['losses'])} steps {drift:.1e}"
            )
    print()
    for line in summary:
        print(f"- {line}")
    if step:
        mem = f", peak {step['peak_memory'] / GIB:.1f} GiB" if step.get("peak_memory") else ""
        print(
            f"\ntrainer step ({step['model']}, {step['calls']} recorded calls -> {step['sequences']} sequences, {step['tokens']} tokens, "
            f"{step['sampled']:.0f} sampled; checkpointing {step['checkpointing']}, packed {step['packed']}): load {step['load_s']:.1f} s, "
            f"batch {step['batch_s']:.3f} s, step {step['step_s']:.3f} s ({step['sampled_tokens_per_s']:,.0f} sampled tokens/s){mem}, save {step['save_s']:.3f} s"
        )
    if whole:
        print(whole_table(whole))
    return 0


if __name__ == "__main__":
    sys.exit(main())
