# ipyparallel profile for engines in a Slurm allocation, for kit.TFCluster(engines=...).
#
#   ipython profile create --parallel --profile=kit-slurm
#   cp docs/profiles/slurm/ipcluster_config.py ~/.ipython/profile_kit-slurm/
#
# In a notebook on the login node:
#   import ipyparallel as ipp, kit
#   engines = ipp.Cluster(profile="kit-slurm")
#   with kit.TFCluster(workers=4, engines=engines, start_timeout=600) as cluster: ...
# With no engines running yet, the kit submits one engine set (one job) per TF task through
# this launcher, so that cluster.restart() and max_failures can replace them; start_timeout
# covers the time the jobs wait in the queue.
# SECURITY: each task's TensorFlow server listens on every interface of its host and runs any op that
# anyone who connects sends (reading and writing files as you). The kit warns with the addresses when
# the cluster starts. Keep these hosts on a private network or VPN, or allow only the peers' addresses
# to the task ports in the host firewall: see docs/security.md.
c = get_config()  # noqa: F821 (defined by ipyparallel when it loads this file)

c.Cluster.controller_ip = "0.0.0.0"          # reachable from the compute nodes
c.Cluster.engine_launcher_class = "slurm"
c.SlurmEngineSetLauncher.batch_template = """#!/bin/bash
#SBATCH --job-name=kit-engine
#SBATCH --ntasks={n}
#SBATCH --cpus-per-task=8
#SBATCH --time=02:00:00
srun {program_and_args}
"""
# Keep the engines from outliving the notebook: they exit after missing the controller's heartbeat.
c.IPEngine.max_heartbeat_misses = 5
