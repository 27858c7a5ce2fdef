"""Placement: ``device_map="auto"`` finds the TPU, within the chip's HBM budget.

What the plugin does to model placement, and why:

- :mod:`.budget` (pure): the HBM budget of a chip (its memory minus a headroom for the KV cache and
  compiled programs, ``TRANSFORMERS_TPU_EXT_HBM_HEADROOM``) and how ``max_memory`` names it.
- ``patch_accelerate_memory``: Accelerate's ``get_max_memory()`` lists the TPU with that budget.
- ``patch_accelerate_offload``: weights offloaded to disk load back onto the TPU.
- ``patch_transformers_device_map``: ``from_pretrained(device_map=...)`` resolves to the TPU.
- ``patch_transformers_pipeline``: ``pipeline(...)`` reads an integer device as the TPU on a TPU host.
- ``patch_transformers_tied_weights``: tied parameters stay tied when a model moves (torch_tpu #4161).
- ``patch_peft_load``: PEFT adapter weights load onto a TPU model.
- :mod:`.host_reads`: safetensors reads TPU-bound weights on the host (both file-reading patches).

See ``docs/placement.md``.
"""
