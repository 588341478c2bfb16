"""Beyond this machine, by simulation: replay recorded draft blocks through each verify policy against a
cost model (``dspark.simulation``), check the predictions against ``bench_load.py``'s measured CPU
points, then predict the throughput / per-user frontier on an H200.

1. Traces: the shipped drafter on the first ``--prompts`` Spec-Bench first turns (the prompts
   ``bench_load.py`` uses, in its order), every drafted position verified (``FixedLength(γ)``) with its
   calibrated estimator scoring survival, greedy and at temperature 1, ``--max-new-tokens`` per row;
   written to ``--traces`` and read back on later runs.
2. Validation: every (mode, c, policy) of the shipped drafter in ``--measured`` (bench_load.json) is
   simulated as bench_load ran it: the same policies learning across the settings in their order, the same
   batches of the same prompts, each batch priced by the cost model ``wrap`` profiles here on the table of its
   shape (rows and padded prompt, ``AutoProfiledCostModel``, without online correction), the median of the
   same number of rounds; the error is predicted / measured − 1 of aggregate tokens/s, against the wall time
   and, where bench_load.json has it (its ``decode_*`` entries), against decoding alone, which is what the
   simulator models (it leaves the prompt's processing out, and EOS: greedy rows that end early are run on).
3. What τ the paper's +60–85% over MTP-1 would need here: DSpark over MTP-1 at c = 1, 2, 4 on this
   machine's cost table for synthetic drafters of τ 1.5 … 5.
4. Prediction on an H200 (``RooflineCostModel`` from the data sheet, bf16), c = 1 … 256, 256 tokens a row:
   SmolLM2-135M with its measured traces, and an 8B Llama-3.1-like target (the paper's 7B–8B class) with
   synthetic traces of the paper's acceptance (τ 3.5 chat, 5.5 math at γ = 7).

    python benchmarks/simulate_load.py

Assumptions of the prediction, also written to the JSON: a forward costs what the roofline says with
no per-forward overhead (an engine with CUDA graphs; dspark's eager loop on a GPU is launch-bound and
slower); drafting a block of γ positions for R rows costs the drafter's own roofline at R·γ tokens (the
8B drafter: one Llama-3.1-8B decoder layer, the context projection and a 32k-token draft head, 0.40 B
parameters); the SmolLM2 blocks recorded on this CPU stand for what the same models would draft there;
the 8B blocks come from a calibrated estimator (c_k equals the block's true acceptance rate), which no
real estimator reaches; no EOS, the context fixed at 1,024 tokens for the KV reads.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from pathlib import Path

import attrs
import torch
from tqdm import tqdm
from transformers.utils import logging as transformers_logging

import dspark
from dspark import pretrained
from dspark.benchmarking import across_categories, write_json
from dspark.cost_models import DEVICES, ProfiledCostModel, RooflineCostModel
from dspark.pretrained import encode_chat
from dspark.simulation import BlockTrace, simulate, synthetic_trace
from dspark.training.data import eval_prompts
from dspark.types import SamplingConfig
from dspark.verify import FixedLength, HardwareAwareScheduler, Threshold, VllmArgmaxRule, calibrated_estimator

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MODES = {"greedy": {"do_sample": False}, "temperature_1": {"do_sample": True, "temperature": 1.0}}
H200_CONCURRENCY = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TAU_SWEEP = (1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0)
# Llama-3.1-8B: 32 layers, width 4096, 8 key/value heads of 128, MLP 14336, vocabulary 128,256.
LLAMA_8B = {"parameters": 8.03e9, "embedding": 128_256 * 4096, "kv_bytes_per_token": 2 * 32 * 8 * 128 * 2}
# Its drafter: one such decoder layer (attention 4096² for q and o, 4096·1024 for k and v; the MLP), the
# projection of three target layers' features, and a 32,000-token draft head: 0.40 B parameters.
LLAMA_8B_DRAFTER_PARAMETERS = (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336) + 3 * 4096 * 4096 + 32_000 * 4096


def _parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--traces", type=Path, default=RESULTS / "load_traces.json")
    parser.add_argument("--measured", type=Path, default=RESULTS / "bench_load.json")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--output", type=Path, default=RESULTS / "simulate_load.json")
    return parser.parse_args(argv)


@attrs.frozen
class TargetAndDrafterRoofline:
    """A cost model from two rooflines: the target's forward, and the drafter's block of ``draft_tokens``
    positions per row (drafting R rows costs the drafter's roofline at R rows of ``draft_tokens`` tokens)."""

    target: RooflineCostModel
    drafter: RooflineCostModel
    draft_tokens: int

    def step_time(self, rows: int, tokens: int) -> float:
        return self.target.step_time(rows, tokens)

    def draft_time(self, rows: int, depth: int | None = None) -> float:
        # The parallel backbone runs the whole block whatever the depth; the per-position head is left out.
        return self.drafter.step_time(rows, self.draft_tokens)


def _trace_to_json(trace: BlockTrace) -> dict:
    return {"survival": [stream.tolist() for stream in trace.survival], "drafted": [stream.tolist() for stream in trace.drafted],
            "accepted": [stream.tolist() for stream in trace.accepted]}


def _trace_from_json(data: dict) -> BlockTrace:
    return BlockTrace(survival=tuple(torch.tensor(stream) for stream in data["survival"]), drafted=tuple(torch.tensor(stream) for stream in data["drafted"]),
                      accepted=tuple(torch.tensor(stream) for stream in data["accepted"]))


def _trace_settings(args) -> dict:
    """What the stored traces depend on: the prompts, in bench_load's order, and the tokens per row."""
    return {"prompts": args.prompts, "order": "across_categories", "max_new_tokens": args.max_new_tokens}


def collect_traces(bundle, messages, args) -> dict:
    """Mode → BlockTrace of the shipped drafter, every drafted position verified, one stream per prompt in order."""
    if args.traces.is_file():
        stored = json.loads(args.traces.read_text())
        if stored["settings"] == _trace_settings(args):
            return {mode: _trace_from_json(data) for mode, data in stored["traces"].items()}
    drafter = bundle.drafter
    confidence = calibrated_estimator(drafter.calibration)
    model = dspark.wrap(bundle.target, drafter, policy=FixedLength(drafter.max_draft_tokens), confidence=confidence)
    traces = {}
    batches = range(0, len(messages), args.batch_size)
    with tqdm(total=len(MODES) * len(batches), desc="traces", unit="batch") as bar:
        for mode, sampling in MODES.items():
            records = []
            for start in batches:
                batch = encode_chat(bundle.tokenizer, messages[start : start + args.batch_size])
                result = model.generate(**batch, max_new_tokens=args.max_new_tokens, generator=torch.Generator().manual_seed(0), **sampling)
                # Streams are keyed by row: offset this batch's rows so that stream i is prompt i.
                records += [attrs.evolve(record, rows=record.rows + start) for record in result.stats.records]
                bar.update(1)
            traces[mode] = BlockTrace.from_records(records)
    write_json(args.traces, {"settings": _trace_settings(args),
                             "traces": {mode: _trace_to_json(trace) for mode, trace in traces.items()}})
    return traces


def _policies(gamma: int, threshold: bool = True) -> dict:
    """Fresh policy objects by bench_load's names (the scheduler's fallback learns across generations)."""
    policies = {"plain": FixedLength(0), "mtp1": FixedLength(1), "fixed_gamma": FixedLength(gamma)}
    if threshold:
        policies["threshold"] = Threshold(0.5)
    policies.update({
        "vllm_rule": VllmArgmaxRule(max_draft_tokens=gamma),
        "dspark": HardwareAwareScheduler(max_draft_tokens=gamma),
        "dspark_candidates": HardwareAwareScheduler(max_draft_tokens=gamma, admission="candidates"),
    })
    return policies


def _batch_count(rows: int, c: int) -> int:
    """How many batches of c prompts bench_load ran at concurrency c for ``--rows`` rows: ceil(rows / c)."""
    return -(-rows // c)


def _streams(trace: BlockTrace, start: int, stop: int) -> BlockTrace:
    """Streams ``start`` … ``stop`` − 1 of ``trace``: the prompts of one measured batch."""
    return attrs.evolve(trace, survival=trace.survival[start:stop], drafted=trace.drafted[start:stop], accepted=trace.accepted[start:stop])


def validate(traces: dict, cost_model, measured: dict, gamma: int, prompt_lengths: dict) -> dict:
    """Predicted against measured aggregate tokens/s for every shipped-drafter point of bench_load.json, simulated the
    way bench_load ran them: one set of policies that learns across the drafter's settings in their measured order
    (modes, then c); at each c the same ceil(rows / c) batches of c prompts (streams b·c … b·c + c − 1), each started
    with its padded prompt length (``prompt_lengths[(c, b)]``), so that the profiled cost model prices its steps on the
    table of its shape and context as in the loop; ``repeats`` rounds over the batches, the prediction the median of
    the rounds' aggregate tokens/s. ``error`` is predicted / measured − 1 against the wall time (prompt processing
    included, which the simulator leaves out) and, where the file has it, ``decode_error`` against decoding alone
    (``decode_tokens_per_s``), the like-for-like one. ``plain_again`` replays as plain decoding."""
    settings = measured["settings"]
    rows, repeats, new_tokens = settings["rows"], settings["repeats"], settings["max_new_tokens"]
    policies = _policies(gamma)
    policies["plain_again"] = policies["plain"]
    points, errors, decode_errors = [], [], []
    for mode in settings["modes"]:
        if mode not in traces or mode not in measured["results"]["shipped"]:
            continue
        sampling = SamplingConfig(**MODES[mode])
        for c_text, entries in measured["results"]["shipped"][mode].items():
            c = int(c_text)
            batches = _batch_count(rows, c)
            if c * batches > len(traces[mode].survival):
                raise SystemExit(f"c = {c} ran {batches} batches of {c} prompts; the traces hold {len(traces[mode].survival)} (raise --prompts)")
            for name, entry in entries.items():
                rounds = []
                for _ in range(repeats):
                    tokens = seconds = row_steps = verified = 0.0
                    for batch in range(batches):
                        run = simulate(_streams(traces[mode], batch * c, (batch + 1) * c), policies[name], cost_model, rows=c, new_tokens=new_tokens,
                                       prompt_length=prompt_lengths[(c, batch)], sampling=sampling)
                        batch_tokens = run.aggregate_tokens_per_s * run.seconds
                        tokens, seconds = tokens + batch_tokens, seconds + run.seconds
                        row_steps, verified = row_steps + batch_tokens / run.tau, verified + run.mean_verify_length * batch_tokens / run.tau
                    rounds.append(tokens / seconds)
                predicted = statistics.median(rounds)
                error = predicted / entry["aggregate_tokens_per_s"] - 1
                errors.append(abs(error))
                point = {"mode": mode, "c": c, "policy": name, "measured": entry["aggregate_tokens_per_s"], "predicted": predicted, "error": error,
                         "measured_verify_length": entry["mean_verify_length"],
                         "predicted_verify_length": verified / row_steps}  # over the last round's batches, as bench_load's
                if "decode_tokens_per_s" in entry:
                    point["measured_decode"] = entry["decode_tokens_per_s"]
                    point["decode_error"] = predicted / entry["decode_tokens_per_s"] - 1
                    decode_errors.append(abs(point["decode_error"]))
                points.append(point)
    summary = {"points": points, **_error_summary(errors, "")}
    if decode_errors:
        summary.update(_error_summary(decode_errors, "decode_"))
        summary.update(_error_summary(_speed_over_plain_errors(points), "vs_plain_"))
    return summary


def _speed_over_plain_errors(points: list[dict]) -> list[float]:
    """Each drafting policy's predicted speed over plain decoding against its measured one (decoding alone, same mode
    and c): ``vs_plain_error`` = (predicted / predicted plain) / (measured / measured plain) − 1, added to its point.
    What a step costs beside the forward and the drafting pass (sampling over the vocabulary, the loop's own work) is
    missing from every policy's prediction alike, and cancels here: this is the error of which policy wins and by how much."""
    plain = {(point["mode"], point["c"]): point for point in points if point["policy"] == "plain"}
    errors = []
    for point in points:
        if point["policy"] in ("plain", "plain_again"):
            continue
        reference = plain[(point["mode"], point["c"])]
        point["vs_plain_error"] = (point["predicted"] / reference["predicted"]) / (point["measured_decode"] / reference["measured_decode"]) - 1
        errors.append(abs(point["vs_plain_error"]))
    return errors


def _error_summary(errors: list[float], prefix: str) -> dict:
    errors = sorted(errors)
    return {f"{prefix}mean_absolute_error": sum(errors) / len(errors), f"{prefix}median_absolute_error": errors[len(errors) // 2],
            f"{prefix}max_absolute_error": errors[-1]}


def tau_needed(cost_model, gamma: int, new_tokens: int) -> dict:
    """On this machine's cost table: DSpark's predicted speed over MTP-1 and over plain decoding at c = 1, 2
    and 4 for synthetic drafters of τ 1.5 … 5 (every position verified, γ), to say what τ the paper's
    +60–85% over MTP-1 would need here; and the same with look-ahead (``look_ahead_*``:
    ``HardwareAwareScheduler(look_ahead=True)``), which crosses a width the table prices above a wider one."""
    report = {}
    for tau in TAU_SWEEP:
        trace = synthetic_trace(tau, gamma, seed=3)
        report[str(tau)] = {}
        for c in (1, 2, 4):
            runs = {}
            # Fresh schedulers at every τ and c: a row fallback's prior learns from every generation it sees.
            schedulers = {"dspark": HardwareAwareScheduler(max_draft_tokens=gamma), "look_ahead": HardwareAwareScheduler(max_draft_tokens=gamma, look_ahead=True)}
            for name, policy in (("plain", FixedLength(0)), ("mtp1", FixedLength(1)), *schedulers.items()):
                simulate(trace, policy, cost_model, rows=c, new_tokens=8)
                runs[name] = simulate(trace, policy, cost_model, rows=c, new_tokens=new_tokens).aggregate_tokens_per_s
            report[str(tau)][str(c)] = {f"{name}_vs_{baseline}": runs[name] / runs[baseline] for name in schedulers for baseline in ("mtp1", "plain")}
    return report


def _roofline(parameters: float, embedding: float, kv_bytes_per_token: float, context: int) -> RooflineCostModel:
    return RooflineCostModel(parameter_bytes=2 * parameters, flops_per_token=2 * (parameters - embedding), device=DEVICES["h200"],
                             kv_bytes_per_token=kv_bytes_per_token, context=context, dtype="bfloat16")


def predict(scenarios: dict, new_tokens: int) -> dict:
    """Scenario → policy → c → SimulatedRun as a dict, on the H200 rooflines."""
    report = {}
    with tqdm(total=len(scenarios) * len(H200_CONCURRENCY), desc="H200 frontier", unit="c") as bar:
        for name, (trace, cost_model, gamma) in scenarios.items():
            policies = _policies(gamma, threshold=False)
            report[name] = {"tau_every_position": trace.tau, "results": {policy: {} for policy in policies}}
            for c in H200_CONCURRENCY:
                for policy_name, policy in policies.items():
                    simulate(trace, policy, cost_model, rows=c, new_tokens=8)
                    report[name]["results"][policy_name][str(c)] = simulate(trace, policy, cost_model, rows=c, new_tokens=new_tokens).to_dict()
                bar.update(1)
    return report


def _plot(report: dict, output: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    validation = report["validation"]["points"]
    modes = sorted({point["mode"] for point in validation})
    scenarios = report["h200"]
    figure, axes = plt.subplots(1, len(modes) + len(scenarios), figsize=(5 * (len(modes) + len(scenarios)), 4.4), squeeze=False)
    # Decoding alone where it was measured: that is what the simulator models.
    measured_key = "measured_decode" if all("measured_decode" in point for point in validation) else "measured"
    for axis, mode in zip(axes[0], modes):
        for policy in sorted({point["policy"] for point in validation}):
            points = [point for point in validation if point["mode"] == mode and point["policy"] == policy]
            axis.scatter([point[measured_key] for point in points], [point["predicted"] for point in points], label=policy, s=18)
        top = max(max(point[measured_key], point["predicted"]) for point in validation)
        axis.plot([0, top], [0, top], color="grey", linewidth=0.8)
        what = "decoding alone" if measured_key == "measured_decode" else "wall time"
        axis.set(title=f"CPU, {mode}: simulated vs measured", xlabel=f"measured aggregate tokens/s ({what})", ylabel="predicted aggregate tokens/s")
        axis.legend(fontsize=7)
    for axis, (name, scenario) in zip(axes[0][len(modes) :], scenarios.items()):
        for policy, by_c in scenario["results"].items():
            axis.plot([run["per_user_tokens_per_s"] for run in by_c.values()], [run["aggregate_tokens_per_s"] for run in by_c.values()], marker="o", label=policy)
        axis.set(title=f"H200 (predicted): {name}", xlabel="per-user tokens/s", ylabel="aggregate tokens/s", xscale="log", yscale="log")
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(output.with_suffix(".png"), dpi=110)
    plt.close(figure)


def main(argv: list[str] | None = None) -> dict:
    args = _parse_args(argv)
    transformers_logging.disable_progress_bar()
    bundle = pretrained.load()
    gamma = bundle.drafter.max_draft_tokens
    # bench_load's order: round-robin over the categories, so that stream i is the prompt of its row i.
    messages = [prompt.message for prompt in across_categories(eval_prompts(args.data_dir, spec_per_category=max(1, -(-args.prompts // 13))))][: args.prompts]
    traces = collect_traces(bundle, messages, args)
    table = dspark.profiled_cost_model(bundle.target, bundle.drafter, gamma).base
    measured = json.loads(args.measured.read_text())
    rows = measured["settings"]["rows"]
    prompt_lengths = {
        (c, batch): encode_chat(bundle.tokenizer, messages[batch * c : (batch + 1) * c])["input_ids"].shape[1]
        for c in measured["settings"]["concurrency"] for batch in range(_batch_count(rows, c))
    }
    report = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "settings": {**vars(args), "traces": str(args.traces), "measured": str(args.measured), "output": str(args.output), "measured_command": measured["command"]},
        "trace_tau_every_position": {mode: trace.tau for mode, trace in traces.items()},
        "validation": validate(traces, table, measured, gamma, prompt_lengths),
    }
    points = report["validation"]["points"]
    for prefix, what, counted in (("", "wall time", "error"), ("decode_", "decoding alone", "decode_error"),
                                  ("vs_plain_", "speed over plain decoding (decoding alone)", "vs_plain_error")):
        if f"{prefix}mean_absolute_error" in report["validation"]:
            print(f"validation on {sum(counted in point for point in points)} CPU points against {what}: mean |error| "
                  f"{report['validation'][prefix + 'mean_absolute_error']:.3f}, median {report['validation'][prefix + 'median_absolute_error']:.3f}, "
                  f"max {report['validation'][prefix + 'max_absolute_error']:.3f}")

    report["tau_needed_on_this_cpu"] = tau_needed(table, gamma, measured["settings"]["max_new_tokens"])
    context = 1024
    smol = RooflineCostModel.for_model(bundle.target, DEVICES["h200"], dtype=torch.bfloat16, context=context)
    smol_drafter_parameters = sum(parameter.numel() for parameter in bundle.drafter.parameters()) + bundle.drafter.get_output_embeddings().weight.numel()
    smol_drafter = _roofline(smol_drafter_parameters, 0, 0, 0)
    llama = _roofline(LLAMA_8B["parameters"], LLAMA_8B["embedding"], LLAMA_8B["kv_bytes_per_token"], context)
    llama_drafter = _roofline(LLAMA_8B_DRAFTER_PARAMETERS, 0, 0, 0)
    scenarios = {
        "SmolLM2-135M, measured greedy traces": (traces["greedy"], TargetAndDrafterRoofline(smol, smol_drafter, gamma), gamma),
        "8B, synthetic tau 3.5 (chat)": (synthetic_trace(3.5, 7, seed=1), TargetAndDrafterRoofline(llama, llama_drafter, 7), 7),
        "8B, synthetic tau 5.5 (math)": (synthetic_trace(5.5, 7, seed=2), TargetAndDrafterRoofline(llama, llama_drafter, 7), 7),
    }
    report["h200"] = predict(scenarios, new_tokens=256)
    report["assumptions"] = __doc__.split("Assumptions of the prediction, also written to the JSON: ")[1].strip()
    write_json(args.output, report)
    _plot(report, args.output)
    print(f"wrote {args.output} and {args.output.with_suffix('.png')}")
    return report


if __name__ == "__main__":
    main()
