"""
attnref: the PyTorch references of attn.c; train_san.py and train_gpt2.py at the repository
root are its two command lines.

  san.py           the SAN family (doc/san-model.md)
  variants.py      its attention kinds and layouts ("Deconstructing Attention")
  gpt2.py          the GPT-2 baseline (doc/gpt2.md)
  sizes.py         both models' parameter lists, counts and FLOPs, without torch
  params.py        init in canonical order, ordered parameters, the shared config mixin
  ops.py           masks, explicit GQA attention and the loss, shared by both models
  optim.py         AdamW, Muon, grad-norm clipping, LR schedules
  indicators.py    attention-pattern indicators and logit statistics
  training.py      debug states, the training loop, validation, sampling, shared CLI pieces
  data.py          token-shard batches and the debug batch
  presets.py       the presets, rates and recipes (presets/, compiled into the trainers)
  container.py     the tensor container: checkpoints and debug states (doc/formats.md)
  ckpt_diff.py     whether two checkpoints hold the same state
  shards.py        token shards and their region and exercise sidecars
  evalset.py       eval sets and the lm-eval-style encoding of their items
  tokenizer.py     SentencePiece and GPT-2 BPE tokenizers, the tokenizer .bin
  header_crc.py    the header CRC of the tokenizer and eval-set files
  gpt2_files.py    llm.c GPT-2 model files and Hugging Face GPT-2 weights
  export_hf.py     a checkpoint as a transformers directory (doc/export.md)
  import_hf.py     a transformers directory as a checkpoint
  hf_tokenizer.py  our SentencePiece model as a transformers fast tokenizer
"""
