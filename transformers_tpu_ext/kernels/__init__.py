"""Hub kernels: on TPU, a kernel that needs ``jax`` says so, naming the install command.

- ``patch_hub_kernels``: the ``transformers.integrations.hub_kernels`` entries.
- ``patch_use_kernels``: ``PreTrainedModel.set_use_kernels``.
"""
