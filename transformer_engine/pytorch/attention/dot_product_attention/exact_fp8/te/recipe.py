"""The recipe side of mask-exact FP8 attention in Transformer Engine.

A recipe asks for mask-exact FP8 attention with its `fp8_dpa_mask_exact` field (on by default,
default from NVTE_FP8_DPA_MASK_EXACT; Float8CurrentScaling and MXFP8BlockScaling have it). This
module answers two questions from TE's recipe objects, without importing TE itself:

  * does a DotProductAttention call run mask-exact FP8 attention (`mask_exact_recipe`)?
  * which field value does a recipe that DotProductAttention builds internally (the
    NVTE_DPA_FP8_RECIPE switch) inherit from the recipe it is built from (`carry_mask_exact`)?

The recipe that decides is the one DotProductAttention quantizes Q, K and V with: its
`fp8_meta["local_recipes"][0]`. Under Float8CurrentScaling that is the user's recipe while
`fp8_meta["recipe"]` is an internal DelayedScaling recipe (for S and dP), so `fp8_meta["recipe"]`
alone cannot tell. See Note [Mask-exact FP8 scaling] in formats.py for what "mask-exact" means.
"""

import contextlib
from typing import Any, Dict, Mapping, Optional

__all__ = [
    "MASK_EXACT_FIELD",
    "kernel_recipe",
    "carry_mask_exact",
    "qkv_recipe",
    "mask_exact_recipe",
    "dpa_runs_mask_exact",
    "MXFP8_NATIVE_CAPABILITY",
    "attention_fp8_autocast_recipe",
]

MASK_EXACT_FIELD = "fp8_dpa_mask_exact"


def kernel_recipe(recipe: Any) -> Optional[str]:
    """The mask-exact kernels' name for a TE recipe: "current", "mxfp8", or None (no such kernel)."""
    if recipe.float8_current_scaling():
        return "current"
    if recipe.mxfp8():
        return "mxfp8"
    return None


def carry_mask_exact(source: Any) -> Dict[str, bool]:
    """Keyword arguments carrying `source`'s field into a recipe DotProductAttention builds from it.

    A source without the field (DelayedScaling, NVFP4BlockScaling, CustomRecipe) carries nothing:
    the built recipe then takes the field's default, NVTE_FP8_DPA_MASK_EXACT as read when
    transformer_engine was imported (as TE's other recipe defaults, e.g. use_power_2_scales).
    """
    if hasattr(source, MASK_EXACT_FIELD):
        return {MASK_EXACT_FIELD: bool(getattr(source, MASK_EXACT_FIELD))}
    return {}


def qkv_recipe(fp8_meta: Mapping[str, Any]) -> Any:
    """The recipe DotProductAttention quantizes Q, K, V with (as upstream's FusedAttention picks it)."""
    local = fp8_meta.get("local_recipes")
    return local[0] if local else fp8_meta["recipe"]


def mask_exact_recipe(fp8: bool, fp8_meta: Mapping[str, Any]) -> Optional[Any]:
    """The QKV recipe if an FP8 DotProductAttention call must run mask-exact FP8 attention, else None.

    Yes iff FP8 is on (`fp8`: DotProductAttention.fp8), FP8 attention is asked for (fp8_dpa or
    fp8_mha), the QKV recipe has a mask-exact kernel (current scaling or MXFP8) and its
    fp8_dpa_mask_exact field is set. Otherwise upstream's path runs unchanged.
    """
    if not fp8:
        return None
    meta_recipe = fp8_meta["recipe"]
    if not (meta_recipe.fp8_dpa or meta_recipe.fp8_mha):
        return None
    recipe = qkv_recipe(fp8_meta)
    if kernel_recipe(recipe) is None or not getattr(recipe, MASK_EXACT_FIELD, False):
        return None
    return recipe


def dpa_runs_mask_exact(dpa: Any) -> bool:
    """Will this DotProductAttention module run mask-exact FP8 attention under the current autocast?

    MultiheadAttention asks this before choosing its FP8 boundary tensors. It builds the module's
    recipes first, as upstream's get_qkv_quantization_capabilities does for the same purpose.
    """
    dpa.init_fp8_metadata(num_gemms=3)
    return mask_exact_recipe(dpa.fp8, dpa.fp8_meta) is not None


MXFP8_NATIVE_CAPABILITY = (10, 0)


@contextlib.contextmanager
def attention_fp8_autocast_recipe(kind: str, **fields):
    """The autocast recipe under which DotProductAttention runs `kind` ("current" or "mxfp8") FP8
    attention on this GPU, for use as `with attention_fp8_autocast_recipe("mxfp8") as recipe:`.

    Upstream's autocast refuses MXFP8BlockScaling below compute capability 10.0, so there the
    attention gets MXFP8 through the NVTE_DPA_FP8_RECIPE=MXFP8BlockScaling switch under a
    Float8CurrentScaling autocast (the switch builds an MXFP8 recipe for attention only; patch 0002
    carries `fields` into it). TE reads that variable at import, so the block sets the module
    globals it was read into, and restores them on exit. `fields` go to the recipe (E4M3 format,
    fp8_dpa=True and fp8_mha=False by default).
    """
    import torch
    from transformer_engine.common import recipe as te_recipe
    from transformer_engine.pytorch.attention import multi_head_attention as mha_module
    from transformer_engine.pytorch.attention.dot_product_attention import (
        dot_product_attention as dpa_module,
    )

    if kind not in ("current", "mxfp8"):
        raise ValueError(f"kind must be 'current' or 'mxfp8', got {kind!r}")
    kwargs = dict(fp8_format=te_recipe.Format.E4M3, fp8_dpa=True, fp8_mha=False, **fields)
    switch = None
    if kind == "mxfp8" and torch.cuda.get_device_capability() >= MXFP8_NATIVE_CAPABILITY:
        yield te_recipe.MXFP8BlockScaling(**kwargs)
        return
    if kind == "mxfp8":
        switch = "MXFP8BlockScaling"
    saved = (dpa_module._dpa_fp8_recipe, mha_module._dpa_fp8_recipe)
    if switch is not None:
        dpa_module._dpa_fp8_recipe = mha_module._dpa_fp8_recipe = switch
    try:
        yield te_recipe.Float8CurrentScaling(**kwargs)
    finally:
        dpa_module._dpa_fp8_recipe, mha_module._dpa_fp8_recipe = saved
