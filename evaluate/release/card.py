"""A release's model card: README.md in the Hugging Face Hub's layout (YAML metadata, then the
text), written with huggingface_hub's own card classes so the Hub reads it as it reads any card."""
from __future__ import annotations

from collections import Counter

from huggingface_hub import ModelCard, ModelCardData

from counteraudit.evaluate.release.manifest import Manifest
from counteraudit.train.core.suite import Suite


def model_card(manifest: Manifest, suite: Suite) -> str:
    roles = Counter(model.role for model in manifest.models)
    families = Counter(model.family for model in manifest.models if model.role == "anomalous")
    data = ModelCardData(
        library_name="counteraudit", license="mit",
        tags=["counteraudit", "model-auditing", "interpretability", "backdoor", suite.name],
        counteraudit={"format": manifest.format, "format_version": manifest.format_version,
                      "suite": manifest.suite, "numerics": manifest.numerics,
                      "code": manifest.counteraudit, "models": len(manifest.models)})
    rows = "\n".join(f"| {m.name} | {m.role} | {m.family} | {m.val_accuracy:.4f} | `{m.key}` |"
                     for m in manifest.models)
    body = f"""
# counteraudit population: suite `{manifest.suite}`

{len(manifest.models)} trained classifiers of the counteraudit benchmark: {roles['reference']}
references, {roles['held-out']} held-out clean models (the null population) and
{roles['anomalous']} anomalous models with planted defects
({', '.join(f'{family} x{count}' for family, count in sorted(families.items())) or 'none'}),
{suite.architecture} on the {suite.world.get('name', 'synthetic')} world, with the image sets
they are explained on and each anomalous model's implant check.

Made by counteraudit {manifest.counteraudit['version']} (commit {manifest.counteraudit['commit']}),
numerics `{manifest.numerics}`: a run in the same numeric mode finds these models under their own
keys and trains nothing.

## Use

    counteraudit population import <this folder, .tar, or hf://owner/name --revision COMMIT>
    counteraudit detect --suite {manifest.suite}

Every file's SHA-256 is in `manifest.json`, and the import checks all of them before anything
enters the store; the manifest's own SHA-256 names this release (`--sha256` pins it). Weights
are safetensors: nothing here is unpickled.

## Models

| name | role | family | val accuracy | key |
|---|---|---|---|---|
{rows}
"""
    return str(ModelCard(f"---\n{data.to_yaml()}\n---\n{body}"))
