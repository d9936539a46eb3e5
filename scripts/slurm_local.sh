#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, to try `--executor slurm` (and for the tests marked `slurm`):
#   bash scripts/slurm_local.sh start    # installs (root, apt) and starts munge, MariaDB, slurmdbd, slurmctld, slurmd
#   bash scripts/slurm_local.sh status   # which of them run (exit 0 when all do and the node answers)
#   bash scripts/slurm_local.sh stop     # stops what `start` started, by the pids it recorded, nothing else
#   bash scripts/slurm_local.sh stop slurmdbd   # only that daemon (e.g. accounting away); `start` brings it back
# The node has this machine's real CPUs and memory (`slurmd -C`); one partition `debug`, the default. Accounting goes
# through slurmdbd and MariaDB: on Slurm 22.05 (Debian 12) that is the only accounting storage `sacct` reads
# (`accounting_storage/none` makes sacct refuse, and there is no file-based one any more).
# Idempotent and quiet: a second start finds everything running and does nothing; messages go to stderr only when
# something is wrong. It writes /etc/slurm/slurm.conf and slurmdbd.conf only when there are none or they are its own,
# so a machine with a real Slurm configuration is left alone (start refuses, naming the file).
set -euo pipefail

STATE=${SLURM_LOCAL_STATE:-/var/lib/trainbench-slurm}  # pid files, logs, spool, the MariaDB data
CONF=/etc/slurm/slurm.conf
DBD_CONF=/etc/slurm/slurmdbd.conf
MARK="# written by trainbench scripts/slurm_local.sh"
DAEMONS="munged mariadbd slurmdbd slurmctld slurmd"  # start order; stop is the reverse
HOST=$(hostname -s)

say() { echo "slurm_local: $*" >&2; }
die() { say "$*"; exit 1; }

pid_of() {  # the pid of daemon $1 if this script started it and it still runs (a reused pid is not it)
  local file="$STATE/pids/$1.pid" pid
  [ -s "$file" ] || return 1
  pid=$(cat "$file")
  [ -d "/proc/$pid" ] && grep -qa -- "$1" "/proc/$pid/cmdline" 2>/dev/null && ! grep -q '^State:.*Z' \
    "/proc/$pid/status" 2>/dev/null && echo "$pid"
}

wait_for() {  # wait_for SECONDS COMMAND...: until COMMAND succeeds
  local until=$((SECONDS + $1)); shift
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$until" ] || return 1
    sleep 0.2
  done
}

install_packages() {
  local pkgs="slurmctld slurmd slurm-client slurmdbd munge mariadb-server" missing=""
  for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
  [ -z "$missing" ] && return 0
  [ "$(id -u)" = 0 ] || die "needs root to install$missing (apt)"
  command -v apt-get >/dev/null || die "no apt-get to install$missing"
  export DEBIAN_FRONTEND=noninteractive
  # Debian's packages would start their daemons through init scripts with their default settings: this script
  # starts them itself, so invoke-rc.d is told not to (policy-rc.d), unless the machine has a policy of its own.
  local policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    policy=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy"
  fi
  local rc=0
  { apt-get install -y -qq --no-install-recommends $missing || { apt-get update -qq &&
      apt-get install -y -qq --no-install-recommends $missing; }; } >"$STATE/apt.log" 2>&1 || rc=$?
  [ -z "$policy" ] || rm -f "$policy"
  [ "$rc" = 0 ] || die "apt-get install$missing failed (see $STATE/apt.log)"
}

ours_or_absent() { [ ! -e "$1" ] || head -1 "$1" | grep -qF "$MARK"; }

write_config() {
  ours_or_absent "$CONF" || die "$CONF exists and is not this script's: this machine has a Slurm configuration of its own"
  ours_or_absent "$DBD_CONF" || die "$DBD_CONF exists and is not this script's"
  local node
  node=$(slurmd -C | head -1 | sed "s/^NodeName=[^ ]*/NodeName=$HOST NodeAddr=127.0.0.1/")  # real CPUs, memory
  mkdir -p /etc/slurm "$STATE"/{pids,log,spool/ctld,spool/d}
  cat > "$CONF.new" <<EOF
$MARK
ClusterName=trainbench
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmctldPidFile=$STATE/pids/slurmctld.pid
SlurmdPidFile=$STATE/pids/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
StateSaveLocation=$STATE/spool/ctld
SlurmdSpoolDir=$STATE/spool/d
AuthType=auth/munge
# No cgroup setup needed (containers, cgroup v1 or v2): processes tracked by ancestry, tasks bound to their cores.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=512
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# A node that was DOWN comes back when its slurmd registers again; short timers keep tries and tests quick.
ReturnToService=2
SlurmdTimeout=30
KillWait=5
MinJobAge=300
InactiveLimit=0
MpiDefault=none
MailProg=/bin/true
$node State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
  mv "$CONF.new" "$CONF"
  umask 077
  cat > "$DBD_CONF" <<EOF
$MARK
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
PidFile=$STATE/pids/slurmdbd.pid
LogFile=$STATE/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageLoc=slurm_acct_db
StorageUser=root
EOF
  chmod 600 "$DBD_CONF"
  umask 022
}

start_munged() {
  pid_of munged >/dev/null && return 0
  if pgrep -x munged >/dev/null; then return 0; fi  # someone else's munged: use it, never stop it
  mkdir -p /run/munge && chown munge:munge /run/munge
  runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid 2>>"$STATE/log/munged.log" ||
    die "munged did not start (see $STATE/log/munged.log)"
  wait_for 10 test -s /run/munge/munged.pid || die "munged wrote no pid file"
  cp /run/munge/munged.pid "$STATE/pids/munged.pid"
}

start_mariadbd() {
  pid_of mariadbd >/dev/null && return 0
  local data="$STATE/mysql" sock="/run/mysqld/mysqld.sock"
  mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
  if [ ! -d "$data/mysql" ]; then
    mkdir -p "$data" && chown mysql:mysql "$data"
    mariadb-install-db --user=mysql --datadir="$data" --auth-root-authentication-method=socket \
      >"$STATE/log/mariadb-install.log" 2>&1 || die "mariadb-install-db failed (see $STATE/log/mariadb-install.log)"
  fi
  # Its own data directory and socket, no TCP: slurmdbd reaches it as root through the socket.
  setsid /usr/sbin/mariadbd --user=mysql --datadir="$data" --socket="$sock" --skip-networking \
    --pid-file="$data/mariadbd.pid" --log-error="$data/mariadb.log" </dev/null >/dev/null 2>&1 &
  wait_for 60 mariadb --socket="$sock" -e "select 1" || die "MariaDB did not start (see $STATE/mysql/mariadb.log)"
  cp "$data/mariadbd.pid" "$STATE/pids/mariadbd.pid"
}

start_slurm_daemon() {  # start_slurm_daemon NAME: slurmdbd, slurmctld or slurmd (each daemonises, writes its pid file)
  pid_of "$1" >/dev/null && return 0
  pgrep -x "$1" >/dev/null && die "a $1 not started by this script runs already (pid $(pgrep -x "$1" | head -1))"
  "/usr/sbin/$1" 2>>"$STATE/log/$1.start.log" || die "$1 did not start (see $STATE/log/$1.log)"
  wait_for 20 pid_of "$1" || die "$1 did not start (see $STATE/log/$1.log)"
}

cluster_ready() {  # the controller answers, accounting knows the cluster, and the node takes jobs
  sinfo -h -N -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated)' && sacct -n -X -S now >/dev/null 2>&1
}

start() {
  [ "$(id -u)" = 0 ] || die "needs root (it installs packages and starts system daemons)"
  mkdir -p "$STATE"
  install_packages
  write_config
  start_munged
  start_mariadbd
  start_slurm_daemon slurmdbd
  wait_for 30 sacctmgr -n list cluster || die "slurmdbd does not answer (see $STATE/log/slurmdbd.log)"
  sacctmgr -n list cluster format=cluster | grep -qw trainbench || sacctmgr -i -Q add cluster trainbench >/dev/null
  start_slurm_daemon slurmctld
  start_slurm_daemon slurmd
  # A node DOWN or DRAINED by an earlier run (a test, a stop while jobs ran) is given back.
  if sinfo -h -N -o '%T' | grep -qiE 'down|drain'; then scontrol update nodename="$HOST" state=resume 2>/dev/null || true; fi
  wait_for 60 cluster_ready || die "the node does not take jobs (sinfo: $(sinfo -h -N -o '%T %E' 2>&1 | head -1))"
}

stop() {  # stop [DAEMON...]: all (their jobs cancelled first), or only those named
  local name pid jobs names
  names=${*:-$(echo "$DAEMONS" | tr ' ' '\n' | tac)}
  for name in $names; do
    case " $DAEMONS " in *" $name "*) ;; *) die "no daemon $name (valid: $DAEMONS)" ;; esac
  done
  # No job left behind: the jobs of this cluster (it is this script's own) are cancelled while slurmctld runs.
  if [ $# = 0 ] && pid_of slurmctld >/dev/null && jobs=$(squeue -h -o %i 2>/dev/null) && [ -n "$jobs" ]; then
    scancel $jobs 2>/dev/null || true
    wait_for 30 sh -c '[ -z "$(squeue -h -o %i)" ]' || say "jobs still ending: $(squeue -h -o %i | tr '\n' ' ')"
  fi
  for name in $names; do
    pid=$(pid_of "$name") || { rm -f "$STATE/pids/$name.pid"; continue; }
    kill "$pid" 2>/dev/null || true
    wait_for 30 sh -c "! kill -0 $pid" || { say "$name (pid $pid) did not stop on SIGTERM: killing it"; kill -9 "$pid" 2>/dev/null || true; }
    rm -f "$STATE/pids/$name.pid"
  done
}

status() {
  local name pid rc=0
  for name in $DAEMONS; do
    if pid=$(pid_of "$name"); then echo "$name: running (pid $pid)"
    elif [ "$name" = munged ] && pgrep -x munged >/dev/null; then echo "munged: running (not started by this script)"
    else echo "$name: stopped"; rc=1; fi
  done
  if [ "$rc" = 0 ]; then
    sinfo -h -N -o 'node %N: %T, %c CPUs, %m MB' 2>/dev/null || rc=1
    command -v sinfo >/dev/null && sinfo -V
  fi
  return "$rc"
}

case "${1:-}" in
  start) start ;;
  stop) shift; stop "$@" ;;
  status) status ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
