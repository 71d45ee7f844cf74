"""The engines behind :class:`runner.rank.engine.Engine`, one per layout: accelerate (one process, DDP,
FSDP, one process over GPUs), DeepSpeed, torch ZeRO-1, and split models (pipeline stages, tensor parallel)."""
