"""
attnref: the PyTorch references of attn.c as a small package; train_san.py and
train_gpt2.py at the repository root are its two command lines.

  container.py   the tensor container (checkpoints, debug states) and config text
  params.py      canonical parameter lists: init order, ordered parameters, FLOPs
  ops.py         masks, explicit GQA attention and the loss, shared by both models
  presets.py     the presets and recipes (presets/, compiled into the trainers) read as data
  san.py         the SAN family (attention sub-layer: san.Attention)
  gpt2.py        the GPT-2 baseline
  gpt2_files.py  llm.c GPT-2 model files and Hugging Face weights
  optim.py       AdamW, Muon, grad-norm clipping, LR schedules
  data.py        token-shard batches (formats: attnref/shards.py) and the debug batch
  training.py    debug states, the training loop, validation, sampling, shared CLI pieces
"""
