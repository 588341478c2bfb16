"""Teacher-forced greedy agreement of drafters with SmolLM2 on its own greedy text, per category.

For each evaluation prompt (Spec-Bench first turns per category, HumanEval, GSM8K test) the target
answers greedily (the answers are cached, so a rerun with other drafters skips this); each drafter
is then scored at every anchor of that text (``dspark.training.agreeing_prefixes``): first-position
agreement and τ with every drafted position verified, which is what greedy verification accepts
from those anchors, over all anchors and over generation's walk (``dspark.training.walk``: the
anchors the generate loop drafts from, which gives its τ without running it). With ``--held-out WORK_DIR``
the held-out own answers of a ``dspark train`` store are scored too, per training source: whether
a gap on the evaluation set is the drafter's or the training text's.

Nothing is timed, so it can run beside training; ``bench_drafters.py`` measures the same drafters
in the loop, with speed. Writes JSON and a bar chart (PNG) beside it.

    python benchmarks/drafter_agreement.py --drafter shipped=dspark/pretrained_drafters/smollm2-135m-instruct \\
        --drafter v2=DIR --held-out ~/.cache/dspark/distill-v2
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import shlex
import sys
from pathlib import Path

import torch
from tqdm import tqdm
from transformers.utils import logging as transformers_logging

from dspark import pretrained
from dspark.benchmarking import generated_tokens, write_json
from dspark.drafters import SemiARDrafter
from dspark.pretrained import encode_chat
from dspark.training import Agreement, TargetPass, agreeing_prefixes, eval_prompts, held_out_for_validation, read_sequences, walk

RESULTS = Path(__file__).resolve().parent / "results"


def _parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafter", action="append", default=[], required=True, help="NAME=PATH of a saved SemiARDrafter (repeatable)")
    parser.add_argument("--data-dir", default=None, help="the prompt-data folder holding eval/ (default: dspark.training.default_data_dir())")
    parser.add_argument("--spec-per-category", type=int, default=5)
    parser.add_argument("--humaneval", type=int, default=20)
    parser.add_argument("--gsm8k", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--held-out", type=Path, default=None, metavar="WORK_DIR", help="also score the held-out own answers of this dspark train work dir")
    parser.add_argument("--validation-share", type=float, default=0.05, help="the share --held-out's training run held out (its --validation-share)")
    parser.add_argument("--max-sequence-tokens", type=int, default=768, help="held-out sequences are cut to this many tokens, as in training")
    parser.add_argument("--output", type=Path, default=RESULTS / "drafter_agreement.json")
    args = parser.parse_args(argv)
    for spec in args.drafter:
        if "=" not in spec:
            parser.error(f"--drafter must be NAME=PATH, got {spec!r}")
    return args


def _summary(agreement: Agreement) -> dict:
    return {"first_position": agreement.first_rate, "tau": agreement.tau, "blocks": agreement.blocks}


def _greedy_answers(args, bundle) -> list[tuple[str, list[int], int]]:
    """(category, prompt and answer tokens, prompt length) of the target's greedy answers to the evaluation
    prompts, read from the cache when these settings were answered before."""
    settings = [args.data_dir, args.spec_per_category, args.humaneval, args.gsm8k, args.max_new_tokens, bundle.target.name_or_path]
    key = hashlib.sha256(json.dumps(settings, default=str).encode()).hexdigest()[:16]
    cache = pretrained.default_cache_dir() / "agreement_texts" / f"{key}.json"
    if cache.is_file():
        return [tuple(entry) for entry in json.loads(cache.read_text())]
    target, eos, answers = bundle.target, bundle.target.generation_config.eos_token_id, []
    for prompt in tqdm(eval_prompts(args.data_dir, args.spec_per_category, args.humaneval, args.gsm8k), desc="greedy answers", unit="prompt"):
        encoded = encode_chat(bundle.tokenizer, [prompt.message])
        length = encoded["input_ids"].shape[1]
        answer = generated_tokens(target.generate(**encoded, max_new_tokens=args.max_new_tokens, do_sample=False), length, eos)[0]
        answers.append((prompt.category, encoded["input_ids"][0].tolist() + answer, length))
    write_json(cache, answers)
    return answers


def _texts(args, bundle) -> list[tuple[str, torch.Tensor, int]]:
    """(group, tokens [L], prompt length) of every text scored: the target's greedy answers to the
    evaluation prompts, then the held-out own answers (group ``held_out:<source>``)."""
    texts = [(category, torch.tensor(tokens), length) for category, tokens, length in _greedy_answers(args, bundle)]
    if args.held_out is not None:
        for record in read_sequences(args.held_out / "data.jsonl"):
            if record["mode"] != "reference" and held_out_for_validation(record["id"], args.validation_share):
                tokens = torch.tensor(record["prompt_ids"] + record["response_ids"])[: args.max_sequence_tokens]
                texts.append((f"held_out:{record['id'].split(':')[0]}", tokens, len(record["prompt_ids"])))
    return texts


def _plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    names = list(report["drafters"])
    groups = list(report["drafters"][names[0]]["groups"])
    width = 0.8 / len(names)
    figure, axes = pyplot.subplots(2, 1, figsize=(max(8, 0.6 * len(groups) * len(names)), 8), sharex=True)
    for axis, key, title in ((axes[0], "groups", "every anchor"), (axes[1], "groups_walk", "generation's walk")):
        for index, name in enumerate(names):
            rates = [report["drafters"][name][key][group]["first_position"] for group in groups]
            axis.bar([g + index * width for g in range(len(groups))], rates, width, label=name)
        axis.set(ylabel="first-position agreement", ylim=(0, 1), title=f"Greedy agreement with the target's own text, {title}")
        axis.legend(fontsize=8)
    axes[1].set_xticks([g + 0.4 - width / 2 for g in range(len(groups))])
    axes[1].set_xticklabels(groups, rotation=60, ha="right", fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    pyplot.close(figure)


def main(argv: list[str] | None = None) -> dict:
    args = _parse_args(argv)
    transformers_logging.disable_progress_bar()
    bundle = pretrained.load()
    drafters = {name: SemiARDrafter.from_pretrained(path, target=bundle.target) for name, path in (spec.split("=", 1) for spec in args.drafter)}
    texts = _texts(args, bundle)
    counts = {anchors: {name: collections.defaultdict(Agreement) for name in drafters} for anchors in ("all", "walk")}
    for group, tokens, prompt_length in tqdm(texts, desc="scoring", unit="text"):
        target_pass = TargetPass.of(bundle.target, tokens)
        for name, drafter in drafters.items():
            prefixes = agreeing_prefixes(drafter, target_pass, prompt_length)
            counts["all"][name][group] += Agreement.of(prefixes)
            counts["walk"][name][group] += Agreement.of(prefixes[walk(prefixes)])
    report = {
        "command": shlex.join([sys.executable, *sys.argv]) if argv is None else shlex.join(["drafter_agreement.py", *argv]),
        "settings": {**vars(args), "held_out": None if args.held_out is None else str(args.held_out), "output": str(args.output)},
        "texts": dict(collections.Counter(group for group, *_ in texts)),
        "drafters": {},
    }
    for name in drafters:
        entry = {}
        for anchors, suffix in (("all", ""), ("walk", "_walk")):
            by_group = counts[anchors][name]
            evaluation = sum((a for g, a in by_group.items() if not g.startswith("held_out:")), Agreement())
            held_out = sum((a for g, a in by_group.items() if g.startswith("held_out:")), Agreement())
            entry[f"evaluation{suffix}"] = _summary(evaluation)
            entry[f"held_out{suffix}"] = _summary(held_out) if held_out.blocks else None
            entry[f"groups{suffix}"] = {group: _summary(agreement) for group, agreement in by_group.items()}
            print(f"{name:20s} {anchors:4s} anchors, evaluation: first {evaluation.first_rate:.3f}, tau {evaluation.tau:.2f}"
                  + (f"; held out: first {held_out.first_rate:.3f}, tau {held_out.tau:.2f}" if held_out.blocks else ""))
        report["drafters"][name] = entry
    write_json(args.output, report)
    _plot(report, args.output.with_suffix(".png"))
    print(f"wrote {args.output} and {args.output.with_suffix('.png')}")
    return report


if __name__ == "__main__":
    main()
