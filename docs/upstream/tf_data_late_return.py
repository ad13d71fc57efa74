"""Deleting a tf.data iterator can wait out its autotuner's sleep: a lost wake-up (TensorFlow 2.21).

    python tf_data_late_return.py                          # autotuning on: some deletions take seconds
    python tf_data_late_return.py --autotune-off           # every deletion takes milliseconds
    TF_CPP_VMODULE=model=2 python tf_data_late_return.py   # "Waiting for N ms" just after "deleting"

One process, a plain iterator: no distribution, no Keras. Each round reads a pipeline for 6 s, so that the
autotuner's period (10 ms, doubling) has reached 5.12 s, then deletes the iterator and times the deletion.
The process is pinned to one CPU (as in a one-CPU container), where the woken autotuner thread and the
deleting thread share it; unpinned, the same happens on a machine that is busy. About 2 minutes at most.
"""

import argparse
import os
import sys
import time

import tensorflow as tf

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--rounds", type=int, default=8)
parser.add_argument("--seconds", type=float, default=6.0, help="reading time before each deletion")
parser.add_argument("--autotune-off", action="store_true", help="options.autotune.enabled = False")
parser.add_argument("--no-pin", action="store_true", help="run on every CPU this process may use")
args = parser.parse_args()
if not args.no_pin:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
print(f"TensorFlow {tf.__version__} ({tf.version.GIT_VERSION}), Python {sys.version.split()[0]}, "
      f"CPUs {sorted(os.sched_getaffinity(0))}, autotune {'off' if args.autotune_off else 'on'}", flush=True)

delays = []
for round_ in range(1, args.rounds + 1):
    dataset = tf.data.Dataset.range(10_000).shuffle(10_000).repeat().batch(64).map(lambda x: x * 2)
    if args.autotune_off:
        options = tf.data.Options()
        options.autotune.enabled = False
        dataset = dataset.with_options(options)
    iterator = iter(dataset)
    started = time.perf_counter()
    while time.perf_counter() - started < args.seconds:
        next(iterator)
    print(f"round {round_}: deleting the iterator", file=sys.stderr, flush=True)
    started = time.perf_counter()
    del iterator
    delays.append(time.perf_counter() - started)
    print(f"round {round_}: deletion took {delays[-1]:.3f} s", flush=True)

late = sum(delay > 1.0 for delay in delays)
print(f"{late} of {len(delays)} deletions took more than 1 s, the longest {max(delays):.2f} s "
      "(expected: a few milliseconds each)")
