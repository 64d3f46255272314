"""``grpo-tune models`` and ``grpo-tune hardware``'s work: the presets that exist, with the model presets' exact
parameter counts.

:func:`run_models` returns a :class:`ModelRow` per model preset and :func:`run_hardware` every hardware profile;
``cli/catalog.py`` prints them (tables, or JSON).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    from grpo_tune.core.specs import HardwareSpec


class ModelRow(TypedDict):
    """One model preset as ``models`` lists it (``--json`` prints these keys in this order)."""

    name: str
    family: str
    layers: int
    hidden: int
    total_params: int
    active_params: int
    hf_id: str


def run_models() -> list[ModelRow]:
    """Every model preset, with its total and active (per token) parameter counts."""
    from grpo_tune.core.specs import list_models, load_model
    from grpo_tune.costmodel.params import active_params, total_params

    rows: list[ModelRow] = []
    for name in list_models():
        m = load_model(name)
        rows.append(
            {
                "name": m.name,
                "family": m.family,
                "layers": m.layers,
                "hidden": m.hidden,
                "total_params": total_params(m),
                "active_params": active_params(m),
                "hf_id": m.hf_id,
            }
        )
    return rows


def run_hardware() -> list[HardwareSpec]:
    """Every hardware profile, loaded."""
    from grpo_tune.core.specs import list_hardware, load_hardware

    return [load_hardware(n) for n in list_hardware()]
