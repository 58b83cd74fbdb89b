"""
to_tensorboard.py: TensorBoard event files from training runs' JSONL logs; with --follow, kept up
to date while the runs train (`tensorboard --logdir DIR` shows them).

    python -m study tensorboard RUN... --out DIR [--follow [--interval 5]]

RUNs and their names are compare.py's; each becomes DIR/<run name>/ with a scalar per number of
its training, validation and eval records at their steps (SCALAR_KEYS, validation_scalars), the
header as text, each event at the time the log gives it. doc/study.md "Comparing runs"; needs
the `tensorboard` package (requirements.txt).
"""
import argparse
import calendar
import json
import os
import sys
import time
import types

from study import runs as run_files
from study.compare import CompareError, log_paths, name_runs  # the same RUN arguments and names

SCALAR_KEYS = {"loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm", "ms": "train/ms"}


def validation_scalars(prefix, rec):
    """(tag, value) of a validation record's numbers: the losses, the per-region losses, the
    layer means, and the per-exercise losses."""
    out = []
    for key, value in rec.items():
        if key == "step" or isinstance(value, bool):
            continue
        if isinstance(value, (int, float)) and (key.startswith("val_") or key.endswith("_mean")):
            out.append((f"{prefix}/{key[4:] if key.startswith('val_') else key}", value))
        elif key == "val_exercise" and isinstance(value, dict):
            out += [(f"{prefix}_exercise/{name}/{region}", v) for name, regions in value.items()
                    for region, v in regions.items() if isinstance(v, (int, float))]
    return out


def scalars_of(rec):
    """(tag, value) pairs of one step record of a log (doc/formats.md "Training log")."""
    if "val_loss" in rec:
        out = validation_scalars("val", rec)
        for nested in ("whole_docs", "train_docs"):
            if isinstance(rec.get(nested), dict):
                out += [(tag.replace(f"{nested}_exercise/", f"{nested}/exercise/"), v)
                        for tag, v in validation_scalars(nested, rec[nested])]
        return out
    if isinstance(rec.get("eval"), dict):
        return [(f"eval/{name}/{metric}", v) for name, metrics in rec["eval"].items() for metric, v in metrics.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool) and metric != "n"]
    if "loss" in rec:
        return [(tag, rec[key]) for key, tag in SCALAR_KEYS.items() if isinstance(rec.get(key), (int, float))]
    return []


class LogClock:
    """The time of each record as the log tells it (TensorBoard's relative and wall-time axes):
    the start time of the header before it (run.started, UTC) plus the step times (ms) of the
    step records since; before any header with a start time, the time of the conversion."""

    def __init__(self):
        self.start, self.elapsed = None, 0.0

    def read(self, line):
        """Takes one log line; returns the time of its record."""
        header = run_files.header_of(line)
        if header is not None:
            try:
                self.start = calendar.timegm(time.strptime(header.get("started", ""), "%Y-%m-%dT%H:%M:%SZ"))
            except ValueError:
                self.start = None
            self.elapsed = 0.0
        rec = run_files.step_record(line)
        if rec is not None and isinstance(rec.get("ms"), (int, float)) and "loss" in rec:
            self.elapsed += rec["ms"] / 1e3
        return self.now()

    def now(self):
        return time.time() if self.start is None else self.start + self.elapsed


class EventWriter:
    """One run's event file (tensorboard's writer: no TensorFlow needed)."""

    def __init__(self, logdir):
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
        self.event_pb2, self.summary_pb2 = event_pb2, summary_pb2
        self.writer = EventFileWriter(logdir)

    def scalars(self, step, pairs, wall_time):
        if pairs:
            values = [self.summary_pb2.Summary.Value(tag=tag, simple_value=float(v)) for tag, v in pairs]
            self.writer.add_event(self.event_pb2.Event(step=step, wall_time=wall_time,
                                                       summary=self.summary_pb2.Summary(value=values)))

    def text(self, tag, text, wall_time):
        """A text summary (TensorBoard's text plugin: a string tensor)."""
        from tensorboard.compat.proto import tensor_pb2, tensor_shape_pb2, types_pb2
        tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[text.encode()],
                                        tensor_shape=tensor_shape_pb2.TensorShapeProto())
        meta = self.summary_pb2.SummaryMetadata(plugin_data=self.summary_pb2.SummaryMetadata.PluginData(plugin_name="text"))
        value = self.summary_pb2.Summary.Value(tag=tag, metadata=meta, tensor=tensor)
        self.writer.add_event(self.event_pb2.Event(step=0, wall_time=wall_time,
                                                   summary=self.summary_pb2.Summary(value=[value])))

    def restart(self, step, wall_time):
        """TensorBoard drops the events at steps from `step` on (a resumed run's superseded records)."""
        start = self.event_pb2.SessionLog(status=self.event_pb2.SessionLog.START)
        self.writer.add_event(self.event_pb2.Event(step=step, wall_time=wall_time, session_log=start))

    def flush(self):
        self.writer.flush()

    def close(self):
        self.writer.close()


def header_text(header):
    """The header record as markdown (TensorBoard renders the text plugin's strings as markdown)."""
    lines = []
    if header.get("command"):
        lines.append(f"`{header['command']}`")
    for key, value in header.items():
        if key != "command":
            lines.append(f"- {key}: `{json.dumps(value)}`")
    return "\n".join(lines)


class Follower:
    """A run's log read on from where the last read stopped (only whole lines)."""

    def __init__(self, run, out):
        self.run = run
        self.writer = EventWriter(os.path.join(out, run.name))
        self.offset = 0
        self.header_written = False
        self.clock = LogClock()

    def convert_existing(self):
        """What the log holds now, as its readers resolve it."""
        with open(self.run.path, "rb") as f:
            data = f.read()
        complete = data[:data.rfind(b"\n") + 1]
        self.offset = len(complete)
        lines = complete.decode("utf-8", "replace").splitlines()
        times = [self.clock.read(line) for line in lines]
        self.write_header(lines, times)
        # (each kept record at the time of its line: resolve_resumes keeps lines' records in order)
        kept = run_files.resolve_resumes(lines)
        stamped = [(rec, t) for line, t in zip(lines, times) for rec in [run_files.step_record(line)] if rec is not None]
        i = 0
        for rec in kept:
            while stamped[i][0] != rec:
                i += 1
            self.writer.scalars(rec["step"], scalars_of(rec), stamped[i][1])
            i += 1
        self.writer.flush()

    def write_header(self, lines, times):
        for line, t in zip(lines, times):
            header = None if self.header_written else run_files.header_of(line)
            if header:
                self.writer.text("run", header_text(header), t)
                self.header_written = True

    def poll(self):
        """Writes the records appended since the last read; returns how many lines it read."""
        try:
            with open(self.run.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return 0
        complete = data[:data.rfind(b"\n") + 1]
        self.offset += len(complete)
        lines = complete.decode("utf-8", "replace").splitlines()
        times = [self.clock.read(line) for line in lines]
        self.write_header(lines, times)
        for line, t in zip(lines, times):
            rec = run_files.step_record(line)
            if rec is None:
                continue
            if "resume" in rec:
                self.writer.restart(rec["step"] + 1, t)
            else:
                self.writer.scalars(rec["step"], scalars_of(rec), t)
        self.writer.flush()
        return len(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description="Writes TensorBoard event files from training runs' JSONL logs "
                                             "(then: tensorboard --logdir DIR).",
                                 epilog="RUN: a run directory holding log.jsonl, or a JSONL log. Needs the tensorboard "
                                        "package (requirements.txt).")
    ap.add_argument("runs", nargs="+", metavar="RUN", help="run directory, JSONL log, or a study's output directory")
    ap.add_argument("--out", required=True, help="the TensorBoard log directory: one folder per run in it")
    ap.add_argument("--follow", action="store_true", help="keep reading the logs as the runs append (Ctrl-C stops)")
    ap.add_argument("--interval", type=float, default=5.0, help="seconds between reads with --follow")
    args = ap.parse_args(argv)
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        sys.stderr.write("to_tensorboard.py: the tensorboard package is missing (bash scripts/setup.sh installs "
                         "requirements.txt, or pip install tensorboard)\n")
        return 2
    try:  # (a log that holds no step yet is fine: --follow waits for them)
        runs = [types.SimpleNamespace(path=path, name=None) for arg in args.runs for path in log_paths(arg)]
    except CompareError as e:
        sys.stderr.write(f"to_tensorboard.py: {e}\n")
        return 2
    name_runs(runs)
    followers = [Follower(run, args.out) for run in runs]
    for f in followers:
        f.convert_existing()
        print(f"{f.run.path} -> {os.path.join(args.out, f.run.name)}")
    if args.follow:
        print(f"following {len(runs)} logs every {args.interval:g} s (Ctrl-C stops); tensorboard --logdir {args.out}",
              flush=True)
        try:
            while True:
                time.sleep(args.interval)
                for f in followers:
                    f.poll()
        except KeyboardInterrupt:
            pass
    for f in followers:
        f.writer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
