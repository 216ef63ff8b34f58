#!/bin/sh
# An ssh stand-in for MPI launchers on ampccl-hosts' emulated hosts: runs a command inside
# another emulated host's network, UTS and mount namespaces (nsenter into that host's holder
# process), the way `ssh HOST COMMAND...` would run it on a real host.
#
#   hosts_ssh.sh [ssh options] HOST COMMAND...
#
# Called by Intel MPI's hydra (I_MPI_HYDRA_BOOTSTRAP=ssh I_MPI_HYDRA_BOOTSTRAP_EXEC=<this>) and
# Open MPI's prte (--prtemca plm_ssh_agent <this>) from a rank running under
# `ampccl-hosts -k K -- PROGRAM`; benches/scripts/compare_hosts.py sets that up.
#
# HOST is host i's address 10.213.0.<i+1> (tests/src/hosts.rs), its hostname
# ampccl-host<i>-<tag>, or host<i>. ssh options are skipped (those that take a value with it).
# Like ssh, the COMMAND words are joined with spaces and run by `sh -c`; unlike ssh, the
# caller's environment and working directory go with it (the hosts share one file system).
#
# The holder of host i's namespaces is found, in this order, from
#   AMPCCL_HOSTS_HOLDERS   holder pids of hosts 0, 1, ... separated by spaces (if ampccl-hosts
#                          exports it), else
#   /proc: the `sh ... ampccl-host-holder ampccl-host<i>-<tag>` process, where <tag> comes from
#          AMPCCL_HOSTS_TAG or from this host's own hostname (ampccl-host<j>-<tag>).
set -eu

while [ $# -gt 0 ]; do
  case $1 in
    -[bcDEeFIiJLlmOopQRSWw]) shift 2 ;;  # an option with a value
    --) shift; break ;;
    -*) shift ;;                          # a flag, or an option with its value attached
    *) break ;;
  esac
done
[ $# -ge 2 ] || { echo "hosts_ssh.sh: usage: hosts_ssh.sh [ssh options] HOST COMMAND..." >&2; exit 255; }
host=$1
shift

case $host in
  10.213.0.*) i=$(( ${host#10.213.0.} - 1 )) ;;
  ampccl-host*-*) i=${host#ampccl-host}; i=${i%%-*} ;;
  host[0-9]*) i=${host#host} ;;
  *) echo "hosts_ssh.sh: unknown host $host (expected 10.213.0.N, ampccl-hostI-TAG or hostI)" >&2; exit 255 ;;
esac

pid=
if [ -n "${AMPCCL_HOSTS_HOLDERS:-}" ]; then
  pid=$(echo "$AMPCCL_HOSTS_HOLDERS" | awk -v i="$i" '{ print $(i + 1) }')
fi
if [ -z "$pid" ]; then
  tag=${AMPCCL_HOSTS_TAG:-}
  if [ -z "$tag" ]; then
    me=$(hostname)
    case $me in
      ampccl-host*-*) tag=${me#ampccl-host}; tag=${tag#*-} ;;
      *) echo "hosts_ssh.sh: not inside an emulated host (hostname $me) and AMPCCL_HOSTS_TAG unset" >&2; exit 255 ;;
    esac
  fi
  want="ampccl-host$i-$tag"
  for p in /proc/[0-9]*; do
    # argv of a holder: sh -c SCRIPT ampccl-host-holder HOSTNAME
    last=$( { tr '\0' '\n' < "$p/cmdline"; } 2>/dev/null | tail -n 2 | tr '\n' ' ') || continue
    if [ "$last" = "ampccl-host-holder $want " ]; then pid=${p#/proc/}; break; fi
  done
fi
[ -n "$pid" ] || { echo "hosts_ssh.sh: no emulated host $host (holder of $i not found)" >&2; exit 255; }
exec nsenter -t "$pid" --net --uts --mount --wd="$PWD" -- sh -c "$*"
