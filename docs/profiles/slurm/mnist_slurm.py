"""The tutorial's MNIST training on a Slurm allocation, without the kit and without TF_CONFIG.

TensorFlow's ``SlurmClusterResolver`` builds the cluster from the variables ``srun`` sets in each task
(SLURM_PROCID, SLURM_STEP_NODELIST, SLURM_STEP_TASKS_PER_NODE): one worker per Slurm task, named by its
node, on port 8888 (and up, for several tasks per node). Submit it with train.sbatch:

    sbatch docs/profiles/slurm/train.sbatch

The same ``train`` runs on the kit's engines with TF_CONFIG instead (``cluster.run(train)``): leave
``resolver`` out. The kit's tests run both on an emulated Slurm cluster and compare their losses.
"""

import json
import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # tf-keras: Keras 3's fit fails under this strategy


def train(resolver=None, per_worker_batch=32, steps=5, examples=1024, seed=7):
    """Train the tutorial's CNN for ``steps`` steps; return each step's loss (the same on every worker)."""
    import numpy as np
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
    tf.keras.utils.set_random_seed(seed)
    rng = np.random.default_rng(seed)  # synthetic MNIST-shaped data: the compute nodes need no download
    x = rng.random((examples, 28, 28), dtype=np.float32)
    y = rng.integers(0, 10, examples)
    global_batch = per_worker_batch * strategy.num_replicas_in_sync
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(global_batch)
    with strategy.scope():
        model = tf.keras.Sequential([
            tf.keras.layers.InputLayer(input_shape=(28, 28)),
            tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
            tf.keras.layers.Conv2D(32, 3, activation="relu"),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(128, activation="relu"),
            tf.keras.layers.Dense(10),
        ])
        model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      optimizer=tf.keras.optimizers.SGD(learning_rate=0.001))
    history = model.fit(dataset, epochs=steps, steps_per_epoch=1, verbose=0)
    return {"loss": history.history["loss"], "workers": strategy.num_replicas_in_sync,
            "task": strategy.cluster_resolver.task_id}


if __name__ == "__main__":
    import tensorflow as tf

    # On CPU nodes, give the resolver one GPU slot per task: it pairs each task of a node with a slot and
    # leaves out tasks without one (gpus_per_node=0 fails with "range() arg 3 must not be zero"; left out,
    # it asks nvidia-smi). auto_set_gpu=False: no CUDA_VISIBLE_DEVICES for the GPUs that are not there.
    tasks_per_node = int(os.environ.get("SLURM_NTASKS_PER_NODE", "1"))
    resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(
        gpus_per_node=tasks_per_node, gpus_per_task=1, auto_set_gpu=False)
    result = train(resolver)
    result["cluster"] = resolver.cluster_spec().as_dict()
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    with open(os.path.join(out, f"losses-{resolver.task_type}-{resolver.task_id}.json"), "w") as f:
        json.dump(result, f)
