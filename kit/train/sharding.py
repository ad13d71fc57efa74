"""Which examples each worker sees: MNIST as TFRecord files, auto-shard policies, manual sharding.

The functions that take a ``strategy`` or build one run on the workers (through ``cluster.run``)
and return plain lists of example ids, so that a notebook can tabulate and draw what each worker
saw. Every example carries its ``id``: its index in MNIST's training set.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ._tf import import_tensorflow
from ..core.errors import OptionError, first_line
from ..core.files import save_figure
from ..core.tfconfig import this_task

#: tf.data's auto-shard policies, as accepted by :func:`with_policy`.
POLICIES = ("AUTO", "FILE", "DATA", "OFF")

# ----- files ------------------------------------------------------------------------------------
def block_ids(examples: int, num_files: int) -> list[list[int]]:
    """The ids each file holds: ``examples`` ids cut into ``num_files`` contiguous blocks."""
    if num_files < 1 or examples < num_files:
        raise OptionError("num_files", f"cannot cut {examples} examples into {num_files} non-empty files",
                          f"give 1 <= num_files <= examples ({examples})")
    return [block.tolist() for block in np.array_split(np.arange(examples), num_files)]


def write_mnist_tfrecords(directory: str | os.PathLike, num_files: int, examples: int,
                          *, path: str | os.PathLike | None = None) -> list[str]:
    """Write MNIST's first ``examples`` training examples as ``num_files`` TFRecord files.

    File ``i`` holds the ids of ``block_ids(examples, num_files)[i]``; each record is a
    ``tf.train.Example`` with ``id`` (int64), ``image`` (784 raw bytes) and ``label`` (int64).
    Returns the file paths in order.
    """
    tf = import_tensorflow()
    from .data import load_mnist

    (x_train, y_train), _ = load_mnist(path)
    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    files = []
    for i, ids in enumerate(block_ids(examples, num_files)):
        name = str(target / f"mnist-{i:02d}-of-{num_files:02d}.tfrecord")
        with tf.io.TFRecordWriter(name) as writer:
            for j in ids:
                feature = {
                    "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[j])),
                    "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[x_train[j].tobytes()])),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(y_train[j])])),
                }
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
        files.append(name)
    return files


def parse_record(record):
    """One serialized record → ``{"id", "image" (28×28 float32 in [0, 1]), "label"}``."""
    tf = import_tensorflow()
    spec = {"id": tf.io.FixedLenFeature([], tf.int64), "image": tf.io.FixedLenFeature([], tf.string),
            "label": tf.io.FixedLenFeature([], tf.int64)}
    parsed = tf.io.parse_single_example(record, spec)
    image = tf.reshape(tf.io.decode_raw(parsed["image"], tf.uint8), (28, 28))
    return {"id": parsed["id"], "image": tf.cast(image, tf.float32) / 255.0, "label": parsed["label"]}


# ----- datasets ---------------------------------------------------------------------------------
def file_dataset(files: Sequence[str]):
    """Examples read from TFRecord files (a file-based source: FILE sharding applies)."""
    tf = import_tensorflow()
    return tf.data.TFRecordDataset(list(files)).map(parse_record)


def memory_dataset(examples: int, *, path: str | os.PathLike | None = None):
    """MNIST's first ``examples`` training examples from memory (no files: FILE sharding cannot apply)."""
    tf = import_tensorflow()
    from .data import load_mnist

    (x_train, y_train), _ = load_mnist(path)
    return tf.data.Dataset.from_tensor_slices({
        "id": np.arange(examples, dtype=np.int64), "image": x_train[:examples],
        "label": y_train[:examples].astype(np.int64)})


def source_dataset(files: Sequence[str] | None = None, examples: int | None = None):
    """:func:`file_dataset` when ``files`` are given, else :func:`memory_dataset`."""
    if files:
        return file_dataset(files)
    if examples is None:
        raise OptionError("files", "neither files= nor examples= was given",
                          "give files= (TFRecord files) or examples= (in-memory examples)")
    return memory_dataset(examples)


def with_policy(dataset, policy: str):
    """``dataset`` with ``tf.data.Options().experimental_distribute.auto_shard_policy`` set."""
    tf = import_tensorflow()
    if policy not in POLICIES:
        raise OptionError("policy", f"{policy!r} is unknown", f"use one of {', '.join(POLICIES)}")
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = getattr(tf.data.experimental.AutoShardPolicy, policy)
    return dataset.with_options(options)


def files_of_worker(files: Sequence[str], worker: int, workers: int) -> list[str]:
    """The files FILE sharding gives to ``worker`` of ``workers``: every ``workers``-th, from ``worker``."""
    return list(files[worker::workers])


# ----- what a worker sees -----------------------------------------------------------------------
def local_ids(dist_strategy, distributed_dataset, steps: int | None = None) -> list[list[int]]:
    """Iterate a distributed dataset of ids; per step, the ids of this worker's replicas, in order.

    Stops after ``steps`` steps, or when the dataset ends on every worker (a worker that runs out
    first gets empty batches meanwhile).
    """
    seen: list[list[int]] = []
    for batch in distributed_dataset:
        seen.append([int(i) for part in dist_strategy.experimental_local_results(batch)
                     for i in part.numpy().ravel()])
        if steps is not None and len(seen) >= steps:
            break
    return seen


def _workers(dist_strategy) -> int:
    return len(dist_strategy.cluster_resolver.cluster_spec().as_dict().get("worker", [])) or 1


def _task() -> dict[str, Any]:
    return {"task": this_task()}


def observe(policy: str = "AUTO", *, files: Sequence[str] | None = None, examples: int | None = None,
            global_batch: int = 8, drop_remainder: bool = False, repeat: bool = False,
            steps: int | None = None, wait_seconds: float | None = None) -> dict[str, Any]:
    """Run on every worker: which ids this worker gets from ``experimental_distribute_dataset``.

    The dataset (``files`` or ``examples``) is batched with the *global* batch and auto-sharded
    with ``policy``, under this process's strategy (:func:`kit.train.strategies.build_strategy`). Returns
    ``task``, ``worker`` (task id), ``workers``, ``steps`` (ids per step), ``error`` (None, or
    the error this worker raised, as "Type: first line") and ``finished``. With ``wait_seconds``
    the iteration runs in a thread and is abandoned after that long (``finished`` False: the
    worker is blocked, e.g. in a collective whose peer failed; restart the cluster afterwards).
    """
    tf = import_tensorflow()
    from .multiworker import call_with_deadline
    from .strategies import build_strategy

    dist = build_strategy("multi_worker_mirrored")
    dataset = source_dataset(files, examples).map(lambda example: example["id"])
    if repeat:
        dataset = dataset.repeat()
    dataset = with_policy(dataset.batch(global_batch, drop_remainder=drop_remainder), policy)
    result = {**_task(), "worker": dist.cluster_resolver.task_id, "workers": _workers(dist),
              "steps": [], "error": None, "finished": True}

    def iterate() -> list[list[int]]:
        return local_ids(dist, dist.experimental_distribute_dataset(dataset), steps)

    if wait_seconds is None:
        try:
            result["steps"] = iterate()
        except (tf.errors.OpError, ValueError) as error:
            result["error"] = first_line(error)
    else:
        outcome = call_with_deadline(iterate, wait_seconds)
        result.update(steps=outcome["value"] or [], error=outcome["error"], finished=outcome["finished"])
    return result


def observe_manual(*, files: Sequence[str] | None = None, examples: int | None = None,
                   global_batch: int = 8, steps: int | None = None) -> dict[str, Any]:
    """Run on every worker: manual sharding through ``distribute_datasets_from_function``.

    The dataset function shards by ``InputContext`` (``shard(num_input_pipelines,
    input_pipeline_id)``) and batches with the *per-replica* batch; tf.data does not auto-shard a
    dataset made this way. Returns what :func:`observe` returns, plus the ``InputContext`` the
    function was called with.
    """
    from .strategies import build_strategy

    dist = build_strategy("multi_worker_mirrored")
    contexts: list[dict[str, int]] = []

    def dataset_fn(context):
        contexts.append({"num_input_pipelines": context.num_input_pipelines,
                         "input_pipeline_id": context.input_pipeline_id,
                         "per_replica_batch": context.get_per_replica_batch_size(global_batch)})
        dataset = source_dataset(files, examples).map(lambda example: example["id"])
        dataset = dataset.shard(context.num_input_pipelines, context.input_pipeline_id)
        return dataset.batch(context.get_per_replica_batch_size(global_batch))

    distributed = dist.distribute_datasets_from_function(dataset_fn)
    return {**_task(), "worker": dist.cluster_resolver.task_id, "workers": _workers(dist),
            "steps": local_ids(dist, distributed, steps), "error": None, "finished": True,
            "input_context": contexts[0]}


# ----- looking at the results (pure) ------------------------------------------------------------
def ids_seen(observed: Mapping[str, Any]) -> list[int]:
    """All ids a worker saw in an :func:`observe` result, in order."""
    return [i for step in observed["steps"] for i in step]


def compact(ids: Iterable[int]) -> str:
    """Ids as sorted ranges, e.g. ``[0, 1, 2, 5, 7, 8]`` → ``"0-2, 5, 7-8"`` (repeats are dropped)."""
    values = sorted(set(int(i) for i in ids))
    parts: list[str] = []
    start = previous = None
    for value in values + [None]:
        if start is not None and (value is None or value != previous + 1):
            parts.append(f"{start}" if start == previous else f"{start}-{previous}")
            start = None
        if value is not None and start is None:
            start = value
        previous = value
    return ", ".join(parts)


def ownership(seen: Sequence[Iterable[int]], examples: int) -> np.ndarray:
    """``counts[w, i]``: how often worker ``w`` saw example ``i`` (ids outside range are ignored)."""
    counts = np.zeros((len(seen), examples), dtype=int)
    for w, ids in enumerate(seen):
        for i in ids:
            if 0 <= i < examples:
                counts[w, i] += 1
    return counts


def owner_codes(counts: np.ndarray) -> np.ndarray:
    """Per example: -1 nobody saw it, ``w`` only worker ``w`` saw it (once or more), ``W`` several did."""
    seen_by = counts > 0
    codes = np.where(seen_by.sum(axis=0) > 1, counts.shape[0], seen_by.argmax(axis=0))
    return np.where(seen_by.any(axis=0), codes, -1)


def plot_ownership(rows: Mapping[str, Sequence[Iterable[int]]], examples: int,
                   path: str | os.PathLike | None = None, title: str = "Which worker saw each example"):
    """One strip per case (label → ids seen by each worker): each example coloured by who saw it."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    workers = max(len(seen) for seen in rows.values())
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#17becf"][:workers]
    colours = ["white"] + palette + ["#d62728"]  # -1 nobody, 0..W-1 one worker, W several
    grid = np.array([owner_codes(ownership(list(seen) + [[]] * (workers - len(seen)), examples)) + 1
                     for seen in rows.values()])
    fig, ax = plt.subplots(figsize=(10, 0.9 + 0.5 * len(rows)))
    ax.imshow(grid, aspect="auto", cmap=ListedColormap(colours), vmin=-0.5, vmax=workers + 1.5,
              interpolation="nearest")
    for y in range(len(rows) - 1):  # white gaps between the strips
        ax.axhline(y + 0.5, color="white", linewidth=4)
    ax.set_yticks(range(len(rows)), list(rows))
    ax.set_xlabel("example id")
    ax.set_title(title)
    handles = [Patch(color=c, label=f"worker:{w} only") for w, c in enumerate(palette)]
    handles += [Patch(color="#d62728", label="several workers"),
                Patch(facecolor="white", edgecolor="grey", label="nobody")]
    ax.legend(handles=handles, loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, frameon=False)
    fig.tight_layout()
    return save_figure(fig, path, bbox_inches="tight")  # the legend is outside the axes
