#!/usr/bin/env bash
# The multi-machine path on one machine: two network namespaces with their own host names
# ("kns1", "kns2", a veth pair 10.9.0.1 <-> 10.9.0.2) play two machines; mpirun in kns1 starts the
# rank of kns2 through a launch agent (`ip netns exec`, instead of ssh) and the ranks talk over TCP
# only. Prints both ranks' hosts and the state fingerprint, then the fingerprint of the same run
# over shared memory in one namespace: they must be equal. Needs root; undoes everything it sets up
# (namespaces, /etc/hosts lines) on exit.
#
#   scripts/dp-two-namespaces.sh        (build/keel must exist)
set -euo pipefail
cd "$(dirname "$0")/.."
keel=$PWD/build/keel
tmp=$(mktemp -d)
cleanup() {
  ip netns del kns1 2>/dev/null || true
  ip netns del kns2 2>/dev/null || true
  sed -i '/ kns[12]$/d' /etc/hosts
  rm -rf "$tmp"
}
trap cleanup EXIT
cleanup
ip netns add kns1
ip netns add kns2
ip link add kv1 type veth peer name kv2
ip link set kv1 netns kns1
ip link set kv2 netns kns2
ip -n kns1 addr add 10.9.0.1/24 dev kv1
ip -n kns2 addr add 10.9.0.2/24 dev kv2
for ns in kns1 kns2; do
  ip -n $ns link set lo up
done
ip -n kns1 link set kv1 up
ip -n kns2 link set kv2 up
printf '10.9.0.1 kns1\n10.9.0.2 kns2\n' >>/etc/hosts
mkdir -p "$tmp"
cat >"$tmp/nsexec" <<'AGENT'
#!/bin/sh
host=$1; shift
exec ip netns exec "$host" unshare --uts sh -c "hostname $host; exec $*"
AGENT
chmod +x "$tmp/nsexec"
printf 'kns1 slots=1\nkns2 slots=1\n' >"$tmp/hosts"
args="train --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 \
  --micro-batch-size 2 --global-batch-size 12 --train-iters 50 --lr-warmup-iters 2 \
  --log-interval 50 --eval-interval 1000 --eval-iters 0 --threads 1 --sample-tokens 0"
ip netns exec kns1 unshare --uts sh -c "hostname kns1; timeout 120 mpirun --allow-run-as-root \
  --hostfile $tmp/hosts -np 2 --mca plm_rsh_agent $tmp/nsexec --mca btl tcp,self \
  --mca btl_tcp_if_include 10.9.0.0/24 --mca oob_tcp_if_include 10.9.0.0/24 \
  $keel $args --save $tmp/tcp" >"$tmp/tcp.log" 2>&1
grep -h "data parallel: MPI" "$tmp/tcp/logs/"rank-*.log
tcp=$(sed -n 's/^state fingerprint: //p' "$tmp/tcp.log")
timeout 120 mpirun --allow-run-as-root --oversubscribe --mca btl_vader_single_copy_mechanism none \
  -np 2 "$keel" $args >"$tmp/shm.log" 2>&1
shm=$(sed -n 's/^state fingerprint: //p' "$tmp/shm.log")
echo "two namespaces over TCP: state fingerprint $tcp"
echo "one namespace, shared memory: state fingerprint $shm"
[[ -n "$tcp" && "$tcp" == "$shm" ]]
