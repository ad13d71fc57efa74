# ipyparallel profile for engines in Slurm jobs, for kit.TFCluster(engines=...).
#
#   ipython profile create --parallel --profile=kit-slurm
#   cp docs/profiles/slurm/ipcluster_config.py ~/.ipython/profile_kit-slurm/
#   (edit the login node's name below)
#
# In a notebook on the login node:
#   import ipyparallel as ipp, kit
#   engines = ipp.Cluster(profile="kit-slurm")
#   with kit.TFCluster(workers=2, engines=engines, start_timeout=600) as cluster: ...
# With no engines running yet, the kit submits one job per TF task through this launcher (each job gets a
# whole node: one task per node), so that cluster.restart() and max_failures can replace them. start_timeout
# covers the time the jobs wait in the queue; past it, the error names the jobs and Slurm's reason.
# cluster.stop() cancels the jobs.
# This file runs as it is in the kit's tests, on an emulated Slurm cluster (`kit sim-cluster`), where only
# controller_location differs.
# SECURITY: each task's TensorFlow server listens on every interface of its node and runs any op that
# anyone who connects sends (reading and writing files as you). The kit warns with the addresses when
# the cluster starts. Keep the nodes on the cluster's private network, or allow only the peers' addresses
# to the task ports in the nodes' firewall: see docs/security.md.
c = get_config()  # noqa: F821 (defined by ipyparallel when it loads this file)

# The controller listens where the compute nodes can reach it ...
c.Cluster.controller_ip = "0.0.0.0"
# ... and tells them at which name or address: this login node's, as the compute nodes see it.
c.Cluster.controller_location = "login1"

c.Cluster.engine_launcher_class = "slurm"
# The batch script goes to this profile's folder, not to the notebook's (ipyparallel writes it to its working
# folder, which it does not let the profile set; an absolute name wins)
c.SlurmEngineSetLauncher.batch_file_name = __import__("os").path.join(
    __import__("os").path.dirname(__file__), "slurm_engine.sbatch")
c.SlurmEngineSetLauncher.batch_template = """#!/bin/bash
#SBATCH --job-name=kit-engine
#SBATCH --nodes=1
#SBATCH --ntasks={n}
#SBATCH --exclusive
#SBATCH --time=02:00:00
#SBATCH --output=/dev/null
srun {program_and_args}
"""
# Keep the engines from outliving the notebook. The kit ties the controller it starts to the notebook's kernel:
# a killed kernel ends the controller, whose last act is `scancel` of the kit's jobs. Should that fail, the
# engines exit after missing 5 of the controller's heartbeats (15 s; the default is 50). Engines read IPEngine
# options from their command line, not from this file.
c.SlurmEngineSetLauncher.engine_args = ["--IPEngine.max_heartbeat_misses=5"]
