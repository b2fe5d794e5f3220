#!/usr/bin/env bash
# Start a real single-node SLURM (Debian's slurm-wlm 22.05 + munge) on this machine, as root.
# (Kept in the repo so that CI and maintainers start the same cluster: tests/test_slurm.py.)
# Checked on these machines: `sbatch --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 --gpus-per-node=0 JOB`
# runs JOB's `srun` with SLURM_PROCID/SLURM_LOCALID/SLURM_NTASKS/SLURM_NODELIST set as on a cluster.
# Usage: slurm-local.sh start | stop      (start installs the packages if they are missing)
set -eu
case "${1:-start}" in
stop)
  for f in /run/slurmctld.pid /run/slurmd.pid; do [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null || true; done
  pid=$(pgrep -u munge -x munged || true); [ -n "$pid" ] && kill $pid || true
  exit 0 ;;
esac
host=$(hostname)
if ! command -v slurmctld >/dev/null; then
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
fi
mkdir -p /run/munge /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
rm -f /var/spool/slurmctld/clustername  # a throwaway local cluster: never refuse an old state dir
chown -R munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge
chmod 700 /var/log/munge /etc/munge
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=local
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
ReturnToService=2
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmdSpoolDir=/var/spool/slurmd
StateSaveLocation=/var/spool/slurmctld
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
NodeName=$host CPUs=$(nproc) RealMemory=8000 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
pgrep -u munge -x munged >/dev/null || runuser -u munge -- /usr/sbin/munged
{ [ -f /run/slurmctld.pid ] && kill -0 "$(cat /run/slurmctld.pid)" 2>/dev/null; } || slurmctld
{ [ -f /run/slurmd.pid ] && kill -0 "$(cat /run/slurmd.pid)" 2>/dev/null; } || slurmd
for _ in $(seq 30); do sinfo -h -o %T 2>/dev/null | grep -q idle && { sinfo; exit 0; }; sleep 1; done
echo "slurm-local: the node did not become idle; see /var/log/slurm/" >&2; exit 1
