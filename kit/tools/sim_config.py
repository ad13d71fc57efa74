"""The configuration files of the emulated cluster (:mod:`kit.tools.sim_cluster`): Slurm's, sshd's, ssh's.

Each is a template that :class:`kit.tools.sim_cluster.SimCluster` fills in with its folder, addresses and
ports.

Why it is built this way (each was measured here, Debian 12, Slurm 22.05, cgroup v1):
- every daemon in a namespace runs under ``unshare --uts`` with the host's own hostname, so slurmd
  registers as ``h1`` and jobs and SSH sessions see ``h1``; slurmctld keeps this machine's hostname, which
  ``SlurmctldHost`` must name;
- ``ip netns exec`` remounts /sys, which hides /sys/fs/cgroup, and slurmd 22.05 will not start without a cgroup
  plugin: an empty tmpfs on /sys/fs/cgroup inside, and ``CgroupPlugin=cgroup/v1`` in cgroup.conf, let it start
  (``ProctrackType=proctrack/linuxproc`` and ``TaskPlugin=task/none`` then use no cgroup at all);
- ``SelectType=select/linear`` gives each job whole nodes, so one engine job per task lands one task per host;
- munged's socket folder is 0755 (the namespaces reach munged through that file) and ``AuthInfo=socket=``
  points Slurm at it;
- sshd runs with ``UsePAM no`` and ``StrictModes no`` (its keys live under /tmp) and the ``sftp`` subsystem
  (OpenSSH 9's scp uses SFTP); clients use :attr:`SimCluster.ssh_config` (the key, no host-key prompts, no
  writes to ~/.ssh).
"""

SLURM_CONF = """\
# An emulated cluster (kit.tools.sim_cluster): slurmctld on this machine, one slurmd per network namespace.
ClusterName=kitsim
SlurmctldHost={host}({ip})
SlurmctldPort={port}
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={socket}
CredType=cred/munge
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool-%n
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd-%n.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/linear
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=2
MinJobAge=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
{nodes}PartitionName=kit Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""

SSHD_CONFIG = """\
ListenAddress {address}
Port 22
HostKey {key}
PidFile {folder}/sshd_{host}.pid
AuthorizedKeysFile {folder}/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
Subsystem sftp {sftp}
"""

SSH_CLIENT = """\
Host *
  User root
  IdentityFile {key}
  IdentitiesOnly yes
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  BatchMode yes
  LogLevel ERROR
  ConnectTimeout 10
"""
