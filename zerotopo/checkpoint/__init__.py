"""Checkpoints on disk, below the trainer: :mod:`.store` (the sharded save directory, its manifest,
CRC32C per piece and the atomic ``latest`` pointer), :mod:`.dcpio` (torch.distributed.checkpoint
reads and writes), :mod:`.dcpmeta` (the stored metadata and pieces, read without it), :mod:`.background`
(saves written by a thread while training goes on), :mod:`.retention` (which saves to keep), :mod:`.hf` (Hugging Face import and export)
and :mod:`.neox` (GPT-NeoX ``global_stepN`` import). The trainer and the export commands both go
through these modules; nothing here imports the trainer."""
