#!/usr/bin/env bash
# A real Slurm on this one host, for tests and trying the sbatch script: Debian's slurm-wlm
# (slurmctld + slurmd) with munge authentication, two Slurm nodes (node1, node2) served by two slurmd
# processes on different ports (`slurmd -N <node>`: the packaged 22.05 build accepts several slurmd
# per host when each node has its own Port and spool dir).
#
#   tools/slurm/local_cluster.sh start    # (root) write the config, start munged, slurmctld, 2 x slurmd
#   tools/slurm/local_cluster.sh status   # sinfo
#   tools/slurm/local_cluster.sh stop     # stop the daemons this script started (by their pid files)
#
# Install first: `make cluster-deps` (apt: munge slurmctld slurmd slurm-client shellcheck).
# Environment: SLURM_LOCAL_DIR (state, logs, pid files; default /var/tmp/megatron_rl_slurm),
#   SLURM_NODES (default 2), SLURM_CPUS_PER_NODE (CPUs each node advertises; default 2),
#   SLURM_GPUS_PER_NODE (count-only `gpu` GRES each node advertises, no devices behind them: lets jobs
#   exercise --gpus-per-node / srun --gres scheduling on a CPU host; default 2, 0 = none).
# The config goes to /etc/slurm/slurm.conf (where the Slurm commands look), marked as written by this
# script; an existing slurm.conf without that mark is never overwritten.
set -euo pipefail
D=${SLURM_LOCAL_DIR:-/var/tmp/megatron_rl_slurm}
NODES=${SLURM_NODES:-2}
CPUS=${SLURM_CPUS_PER_NODE:-2}
GPUS=${SLURM_GPUS_PER_NODE:-2}
CONF=/etc/slurm/slurm.conf
MARK="# written by megatron_rl tools/slurm/local_cluster.sh"
die() { echo "local_cluster.sh: $*" >&2; exit 2; }
[[ "$NODES" =~ ^[1-9]$ ]] || die "SLURM_NODES=$NODES: want 1..9"
[[ "$CPUS" =~ ^[1-9][0-9]*$ ]] || die "SLURM_CPUS_PER_NODE=$CPUS: want an integer >= 1"
[[ "$GPUS" =~ ^[0-9]+$ ]] || die "SLURM_GPUS_PER_NODE=$GPUS: want an integer >= 0"

write_conf() {
  if [[ -f "$CONF" ]] && ! grep -qF "$MARK" "$CONF"; then
    die "$CONF exists and was not written by this script; not touching it"
  fi
  mkdir -p "$D/state" "$D/log" /etc/slurm
  # slurmd counts a gpu GRES only with a character device behind each: null devices (1,3) stand in
  # (no cgroup device constraint here, so nothing opens them; jobs just see CUDA_VISIBLE_DEVICES)
  local g
  for g in $(seq 0 $((GPUS - 1))); do
    if [[ ! -c "$D/fake-gpu$g" ]] && ! { rm -f "$D/fake-gpu$g"; mknod "$D/fake-gpu$g" c 1 3; } 2>/dev/null; then
      echo "local_cluster.sh: cannot mknod stand-in GPU devices here; nodes get no gpu GRES" >&2
      GPUS=0
      break
    fi
  done
  local host; host=$(hostname -s)
  {
    echo "$MARK"
    cat <<EOF
ClusterName=mrl-local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=6817
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool-%n
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd-%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd-%n.log
# no cgroups here (containers): track job processes by process tree, no task binding
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
JobRequeue=1
KillWait=10
MinJobAge=600
SlurmdTimeout=60
GresTypes=gpu
EOF
    local i gres=""
    if ((GPUS > 0)); then gres="Gres=gpu:$GPUS "; fi
    for i in $(seq 1 "$NODES"); do
      echo "NodeName=node$i NodeHostname=$host NodeAddr=127.0.0.1 Port=$((6817 + i)) CPUs=$CPUS ${gres}State=UNKNOWN"
    done
    echo "PartitionName=local Nodes=node[1-$NODES] Default=YES MaxTime=INFINITE State=UP"
  } >"$CONF.new"
  {
    echo "$MARK"
    for g in $(seq 0 $((GPUS - 1))); do echo "Name=gpu File=$D/fake-gpu$g"; done
  } >/etc/slurm/gres.conf.new
  # daemons running on another config: restart them (clients reading a config that differs from the
  # daemons' fail with errors such as "gres_job_state_unpack: no plugin configured")
  if ! cmp -s "$CONF.new" "$CONF" || ! cmp -s /etc/slurm/gres.conf.new /etc/slurm/gres.conf; then
    stop >/dev/null
    sleep 1
  fi
  mv "$CONF.new" "$CONF"
  mv /etc/slurm/gres.conf.new /etc/slurm/gres.conf
}

pid_alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

start() {
  [[ $EUID -eq 0 ]] || die "start needs root (daemons, /etc/slurm)"
  local b
  for b in slurmctld slurmd munged sbatch; do
    command -v "$b" >/dev/null || die "$b not installed: run \`make cluster-deps\` (apt: munge slurmctld slurmd slurm-client)"
  done
  write_conf
  # munge: key from the package (created at install), daemon as the munge user
  [[ -s /etc/munge/munge.key ]] || { mungekey --create --keyfile=/etc/munge/munge.key; chown munge: /etc/munge/munge.key; }
  mkdir -p /run/munge /var/log/munge /var/lib/munge && chown munge: /run/munge /var/log/munge /var/lib/munge
  if ! munge -n </dev/null >/dev/null 2>&1; then
    runuser -u munge -- /usr/sbin/munged
    cp /run/munge/munged.pid "$D/munged.pid"  # started here: `stop` stops it too
  fi
  pid_alive "$D/slurmctld.pid" || slurmctld
  local i
  for i in $(seq 1 "$NODES"); do
    mkdir -p "$D/spool-node$i"
    pid_alive "$D/slurmd-node$i.pid" || slurmd -N "node$i"
  done
  for _ in $(seq 60); do  # until every node is idle (or allocated by an earlier job)
    if (( $(sinfo -h -N -t idle,alloc,mix -o %N 2>/dev/null | sort -u | wc -l) >= NODES )); then
      sinfo -N; return 0
    fi
    scontrol update nodename="node[1-$NODES]" state=resume >/dev/null 2>&1 || true
    sleep 1
  done
  sinfo -N >&2 || true
  die "nodes did not come up; see $D/log/"
}

stop() {
  local f
  for f in "$D"/slurmd-node*.pid "$D/slurmctld.pid" "$D/munged.pid"; do
    if pid_alive "$f"; then kill -TERM "$(cat "$f")"; fi
  done
  rm -f "$D/munged.pid"
  for _ in $(seq 20); do  # until they have exited (a restart must not find the old ports busy)
    local alive=0
    for f in "$D"/slurmd-node*.pid "$D/slurmctld.pid"; do pid_alive "$f" && alive=1; done
    (( alive )) || break
    sleep 0.5
  done
  echo "stopped slurmctld and slurmd (and munged if started here)"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) sinfo -N ;;
  *) die "usage: $0 start|stop|status" ;;
esac
