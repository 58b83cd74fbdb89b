"""
train_gpt2.py -- PyTorch reference for the GPT-2 baseline, the numerical twin of
train_gpt2.cu: the command line over the attnref package (attnref/gpt2.py the model,
gpt2_files.py llm.c model files and Hugging Face weights; the container, AdamW, the
schedules, the data loader and the training loop are the ones train_san.py uses).

It builds the model from a size preset and a seed (GPT-2 init, no download) or loads the
pretrained GPT-2 weights from Hugging Face when the network allows (--init-from-hf);
writes debug states for test_gpt2.cu; reads and writes llm.c's GPT-2 model files
(--write-llmc, --init-from-llmc); trains on llm.c-format token shards (a small loop, for
demos and cross-checks); evaluates and samples.

Examples:
  python train_gpt2.py --preset tiny --write-debug-state out.bin
  python train_gpt2.py --preset gpt2 --init-from-hf gpt2 --save-checkpoint gpt2_124M.ckpt
  python train_gpt2.py --preset tiny --write-llmc tiny_llmc.bin --llmc-dtype fp32
  python train_gpt2.py --preset demo --train-data "data/offline/kjv/kjv_train_*.bin" --steps 100
"""

import sys
from dataclasses import fields

from attnref import training
from attnref.container import ContainerError, load_params_into
from attnref.gpt2 import (GPT2, PRESETS, GPT2Config, count_parameters, flops_per_token, load_checkpoint,
                          make_optimizer)
from attnref.gpt2_files import gpt2_from_hf, read_llmc, write_llmc
from attnref.optim import OptConfig
from attnref.presets import read_rates


def build_parser():
    p, g = training.base_parser("PyTorch reference for GPT-2 (see doc/gpt2.md)", PRESETS)
    for f in fields(GPT2Config):
        g.add_argument(training.model_flag(f.name), dest=f.name, type=int, default=None)
    g.add_argument("--init-from-hf", metavar="NAME", help="pretrained weights from Hugging Face (gpt2, gpt2-medium, ...)")
    g.add_argument("--init-from-llmc", metavar="PATH", help="weights (and config) from an llm.c GPT-2 model file")
    o = p.add_argument_group("optimizer and schedule (AdamW)")
    o.add_argument("--lr", type=float, default=read_rates("gpt2", "gpt2").adamw,
                   help="peak rate of the matrix group (default: presets/rates/gpt2.conf)")
    o.add_argument("--lr-other", type=float, default=None, help="peak rate of embeddings/biases/LayerNorm (default: --lr)")
    for name in ("weight_decay", "beta1", "beta2", "eps", "grad_clip", "warmup_frac", "decay_frac", "final_frac"):
        o.add_argument("--" + name.replace("_", "-"), type=float, default=getattr(OptConfig, name))
    o.add_argument("--schedule", choices=("wsd", "cosine", "linear", "constant"), default="wsd")
    o.add_argument("--schedule-steps", type=int, default=0, help="steps the schedule runs over (0: --steps)")
    o.add_argument("--decay-embedding", type=int, choices=(0, 1), default=0,
                   help="1: the embeddings (wte, wpe) decay with --weight-decay too")
    r = p.add_argument_group("run")
    training.add_run_args(r)
    r.add_argument("--write-llmc", metavar="PATH", help="write the (initial or trained) model as an llm.c model file")
    r.add_argument("--llmc-dtype", choices=("fp32", "bf16"), default="fp32")
    r.add_argument("--tokenizer", metavar="PATH",
                   help="tokenizer .bin (as train_gpt2.cu reads it): sets the vocabulary size and BOS, decodes the sample")
    return p


def config_from_args(args):
    kw = dict(PRESETS[args.preset])
    for f in fields(GPT2Config):
        if getattr(args, f.name) is not None:
            kw[f.name] = getattr(args, f.name)
    return GPT2Config(**kw)


def opt_from_args(args):
    kw = {name: getattr(args, name) for name in ("weight_decay", "beta1", "beta2", "eps", "grad_clip", "schedule",
                                                 "warmup_frac", "decay_frac", "final_frac", "schedule_steps",
                                                 "decay_embedding")}
    oc = OptConfig(optimizer="adamw", lr=args.lr, lr_other=args.lr if args.lr_other is None else args.lr_other, **kw)
    oc.validate()
    return oc


def build_model(args):
    """(model, step, checkpoint meta, checkpoint tensors) from the flags."""
    sources = [s for s in (args.load_checkpoint, args.init_from, args.init_from_hf, args.init_from_llmc) if s]
    if len(sources) > 1:
        raise ValueError("--load-checkpoint, --init-from, --init-from-hf and --init-from-llmc are exclusive")
    if args.load_checkpoint:
        return load_checkpoint(args.load_checkpoint)
    if args.init_from:  # the model only: the optimizer and the schedule start fresh
        return load_checkpoint(args.init_from)[0], 0, None, None
    if args.init_from_hf:
        return gpt2_from_hf(args.init_from_hf, args.seq_len), 0, None, None
    if args.init_from_llmc:
        cfg, tensors = read_llmc(args.init_from_llmc, args.bos_id)
        model = GPT2(cfg)
        load_params_into(model, tensors, args.init_from_llmc)
        return model, 0, None, None
    return GPT2(config_from_args(args)).init_weights(args.seed), 0, None, None


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        oc = opt_from_args(args)
        tb = training.load_tokenizer_bin(args.tokenizer) if args.tokenizer else None
        if tb is not None and not (args.load_checkpoint or args.init_from or args.init_from_hf or args.init_from_llmc):
            if args.vocab_size is None:  # the tokenizer sets the vocabulary (as train_gpt2.cu)
                args.vocab_size = tb["vocab_size"]
            if args.bos_id is None and tb["bos"] >= 0:
                args.bos_id = tb["bos"]
        model, step0, ckpt_meta, ckpt_tensors = build_model(args)
        if tb is not None and tb["vocab_size"] != model.cfg.vocab_size:
            raise ValueError(f"--tokenizer {args.tokenizer} has a vocabulary of {tb['vocab_size']}; the model has "
                             f"{model.cfg.vocab_size}")
        T = training.row_length(args, model.cfg)
    except (ValueError, ContainerError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    cfg = model.cfg
    training.print_model(cfg, count_parameters(cfg), flops_per_token(cfg))

    if args.write_debug_state:
        if args.write_llmc:  # the initial parameters, before the debug state trains the model
            write_llmc(args.write_llmc, model, args.llmc_dtype)
            print(f"llm.c model file: {args.write_llmc} (initial parameters)")
        training.debug_state_from_args(args, model, oc, make_optimizer)
        return 0

    model = model.to(training.resolve_device(args.device))
    resume_tensors = ckpt_tensors if ckpt_meta is not None and ckpt_meta.get("has_optimizer") == "1" else None
    try:
        training.train_and_validate(args, model, oc, make_optimizer, step0, resume_tensors, T)
    except (ValueError, ContainerError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.write_llmc:
        write_llmc(args.write_llmc, model, args.llmc_dtype)
        print(f"llm.c model file: {args.write_llmc}")
    training.print_sample(args, model, tb)
    return 0


if __name__ == "__main__":
    sys.exit(main())
