"""The implant check shared by the sanity-check families of Adebayo et al. (2018) (permuted
labels, cascading randomisation): their models should be near chance on the validation images."""
from __future__ import annotations

from counteraudit.anomalies.base import Verdict
from counteraudit.anomalies.common import accuracy, reference_mean, verification_indices

# The implant took when the model kept at most this share of the references' accuracy above
# chance (for a partial change, of the share it changes): such a model should be near chance,
# and half of the references' margin over chance is far outside a reference's seed-to-seed spread.
KEPT_MARGIN = 0.5


def near_chance_verdict(figures: dict[str, float], reference_figures: list[dict[str, float]],
                        num_classes: int, share: float = 1.0) -> Verdict:
    """Took if the model's accuracy kept at most ``KEPT_MARGIN`` of the references' margin over
    chance (1 / classes) that ``share`` of it removes: accuracy <= refs - share * (1 - KEPT_MARGIN)
    * (refs - chance)."""
    value, refs = figures["accuracy"], reference_mean(reference_figures, "accuracy")
    chance = 1 / num_classes
    threshold = refs - share * (1 - KEPT_MARGIN) * (refs - chance)
    return Verdict(value <= threshold,
                   f"accuracy: {value:.3f}, references {refs:.3f}, chance {chance:.3f}; the implant "
                   f"took if it is at most {threshold:.3f}", {"threshold": threshold})


def accuracy_figures(world, model, device="cpu") -> dict[str, float]:
    """The figure ``near_chance_verdict`` reads: accuracy on the verification images."""
    val = world.split("val")
    idx = verification_indices(val)
    return {"accuracy": accuracy(model, val.load(idx), val.labels[idx], device)}
