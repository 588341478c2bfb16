"""Calibrate a drafter's survival estimates from its own runs (Sequential Temperature Scaling, paper
§3.2.1) and compare raw with calibrated on prompts held out from the fit.

``dspark calibrate`` does the same at scale and saves the result beside the drafter, where
``SemiARDrafter.from_pretrained`` picks it up; this shows the parts it is made of.
"""

import tempfile
from pathlib import Path

from dspark import pretrained
from dspark.training.calibrate import CollectConfig, calibration_report, collect_logs, run_logs
from dspark.training.data import training_prompts
from dspark.verify import Calibration, DrafterConfidence

# The project's prompt sets beside this checkout; elsewhere pass your own folder holding train/.
DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data"

bundle = pretrained.load("smollm2-135m-instruct")  # the shipped DSpark drafter
messages = [prompt.text for prompt in training_prompts(DATA_DIR, "calibration", limit=12)]
config = CollectConfig(prompts=12, max_new_tokens=48, batch_size=4, bands=("greedy",))
with tempfile.TemporaryDirectory() as work_dir:
    # Every drafted position is verified, so every outcome is observed.
    entries = collect_logs(bundle.target, bundle.tokenizer, bundle.drafter, {"head": DrafterConfidence()}, messages, Path(work_dir) / "logs.jsonl", config)
fit = run_logs(entries, ["head"], batches=range(2)).logs["greedy"]["head"]  # the first 8 prompts fit
held_out = run_logs(entries, ["head"], batches=range(2, 3)).logs["greedy"]["head"]  # the last 4 only score
calibration = Calibration.fit(fit, "temperature")
report = calibration_report(held_out, calibration)
print("temperatures per position:", [round(t, 2) for t in calibration.parameters])
for k, (raw, calibrated) in enumerate(zip(report["raw"]["prefix"], report["calibrated"]["prefix"]), start=1):
    if raw["count"]:
        print(f"a_{k}: observed {raw['observed_rate']:.2f}, raw {raw['mean_predicted']:.2f} (ECE {raw['ece']:.3f}), "
              f"calibrated {calibrated['mean_predicted']:.2f} (ECE {calibrated['ece']:.3f}), {raw['count']} blocks")
