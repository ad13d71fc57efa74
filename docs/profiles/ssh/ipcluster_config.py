# ipyparallel profile for engines on other hosts over SSH, for kit.TFCluster(engines=...).
#
#   ipython profile create --parallel --profile=kit-ssh
#   cp docs/profiles/ssh/ipcluster_config.py ~/.ipython/profile_kit-ssh/
#   (edit the host names below; every host needs the same Python environment at the same path: a shared
#   file system, or `pip install -e .` there)
#
# Then, in a notebook:
#   import ipyparallel as ipp, kit
#   engines = ipp.Cluster(profile="kit-ssh")
#   with kit.TFCluster(workers=2, engines=engines) as cluster: ...
# With no engines running yet, the kit starts one engine per task through this launcher, one per host
# slot listed below, and cluster.restart() / max_failures start fresh ones; cluster.stop() ends them.
# This file runs as it is in the kit's tests, on emulated hosts (`kit sim-cluster`), where only the host
# names, the login node's address and the ssh_config path differ.
# SECURITY: each task's TensorFlow server listens on every interface of its host and runs any op that
# anyone who connects sends (reading and writing files as you). The kit warns with the addresses when
# the cluster starts. Keep these hosts on a private network or VPN, or allow only the peers' addresses
# to the task ports in the host firewall: see docs/security.md.
c = get_config()  # noqa: F821 (defined by ipyparallel when it loads this file)

# The controller must listen on an address the engine hosts can reach (not loopback) ...
c.Cluster.controller_ip = "0.0.0.0"
# ... and tell them which address that is: this machine's name or IP as the engines see it.
c.Cluster.controller_location = "login1"

c.Cluster.engine_launcher_class = "ssh"
# host -> number of engines on that host; one engine per TF task is what the kit needs.
c.SSHEngineSetLauncher.engines = {"node1": 1, "node2": 1}
# The same Python on every host (a shared file system, or the same path everywhere).
c.SSHEngineSetLauncher.remote_python = "/path/to/project/.venv/bin/python"
# ssh and scp with their options in one ssh_config file (its IdentityFile, and for a cluster you trust,
# StrictHostKeyChecking/UserKnownHostsFile; BatchMode yes: fail instead of asking for a password), so
# that nothing waits for an answer. OpenSSH 9's scp speaks SFTP: the hosts' sshd needs its sftp subsystem.
c.SSHLauncher.ssh_args = ["-F", "/home/you/.ssh/kit-cluster.config"]
c.SSHLauncher.scp_args = ["-F", "/home/you/.ssh/kit-cluster.config"]
# The kit ties the controller it starts to the notebook's kernel: a killed kernel ends the controller, whose
# last act is to kill the kit's engines over ssh. Should that fail (a host unreachable), engines notice a dead
# controller after 5 missed heartbeats (15 s; the default is 50). Engines read IPEngine options from their
# command line, not from this file.
c.SSHEngineSetLauncher.engine_args = ["--IPEngine.max_heartbeat_misses=5"]
