# ipyparallel profile for engines on other hosts over SSH, for kit.TFCluster(engines=...).
#
#   ipython profile create --parallel --profile=kit-ssh
#   cp docs/profiles/ssh/ipcluster_config.py ~/.ipython/profile_kit-ssh/
#   (edit the hosts below; every host needs the same Python environment: `pip install -e .` there)
#
# Then, in a notebook:
#   import ipyparallel as ipp, kit
#   engines = ipp.Cluster(profile="kit-ssh")
#   engines.start_cluster_sync()                      # one engine per host listed below
#   with kit.TFCluster(workers=2, engines=engines) as cluster: ...
# or start them from a shell (`ipcluster start --profile=kit-ssh`) and pass
#   engines="~/.ipython/profile_kit-ssh/security/ipcontroller-client.json"
# Engines that trained once have TensorFlow imported: restart them for the next TFCluster.
# SECURITY: each task's TensorFlow server listens on every interface of its host and runs any op that
# anyone who connects sends (reading and writing files as you). The kit warns with the addresses when
# the cluster starts. Keep these hosts on a private network or VPN, or allow only the peers' addresses
# to the task ports in the host firewall: see docs/security.md.
c = get_config()  # noqa: F821 (defined by ipyparallel when it loads this file)

# The controller must listen on an address the engine hosts can reach (not loopback) ...
c.Cluster.controller_ip = "0.0.0.0"
# ... and tell them which address that is: this machine's name or IP as the engines see it.
c.Cluster.controller_location = "login-node.example.org"

c.Cluster.engine_launcher_class = "ssh"
# host -> number of engines on that host; one engine per TF task is what the kit needs.
c.SSHEngineSetLauncher.engines = {"node1.example.org": 1, "node2.example.org": 1}
# The same Python on every host (a shared file system, or the same path everywhere).
c.SSHEngineSetLauncher.remote_python = "/path/to/project/.venv/bin/python"
# Engines notice a dead controller after this many missed heartbeats (default 50, minutes).
c.IPEngine.max_heartbeat_misses = 5
