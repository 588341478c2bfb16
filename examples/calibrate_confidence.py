"""How well does the shipped drafter know which of its tokens the target will accept? Its raw
confidence head against the calibrated estimator ``wrap`` uses by default, on calibration prompts
that ``dspark calibrate`` held out from the fit (the prefix survival a_k predicted per position,
against how often the first k drafted tokens were all accepted).
"""

import tempfile
from pathlib import Path

import dspark
from dspark.training.calibrate import CollectConfig, calibration_report, collect_logs, run_logs
from dspark.training.data import training_prompts
from dspark.verify import DrafterConfidence

# The project's prompt sets beside this checkout; elsewhere pass your own folder holding train/.
DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data"

bundle = dspark.pretrained.load("smollm2-135m-instruct")  # the shipped drafter and its calibration.json
print("calibration:", bundle.drafter.calibration.fitted_on)
# The last prompts of the calibration split `dspark calibrate --prompts 96` used: held out from its fit.
messages = [prompt.text for prompt in training_prompts(DATA_DIR, "calibration", limit=96)][-8:]
estimators = {"raw head": DrafterConfidence(), "calibrated": dspark.wrap(bundle.target, bundle.drafter).strategy.confidence}
config = CollectConfig(prompts=8, max_new_tokens=48, batch_size=4, bands=("greedy",))
with tempfile.TemporaryDirectory() as work_dir:  # every drafted position is verified, so every outcome is seen
    entries = collect_logs(bundle.target, bundle.tokenizer, bundle.drafter, estimators, messages, Path(work_dir) / "logs.jsonl", config)
logs = run_logs(entries, list(estimators)).logs["greedy"]
reports = {name: calibration_report(log)["raw"]["prefix"] for name, log in logs.items()}
for k, (raw, calibrated) in enumerate(zip(reports["raw head"], reports["calibrated"]), start=1):
    if raw["count"]:
        print(f"a_{k}: observed {raw['observed_rate']:.3f}; raw head predicts {raw['mean_predicted']:.3f} (ECE {raw['ece']:.3f}), "
              f"calibrated {calibrated['mean_predicted']:.3f} (ECE {calibrated['ece']:.3f}); {raw['count']} blocks")
