#!/usr/bin/env bash
# keel launch's bad-host handling across real "machines" on one machine (issue 33, scenario a):
# four network namespaces with their own host names (kh1..kh4, on a bridge, 10.9.1.1-4) play four
# hosts; mpirun runs in kh1 and starts the ranks of the others through a launch agent (`ip netns
# exec`, instead of ssh), over TCP only. kh4 is the spare. The rank on kh2 hangs at iteration 30
# (KEEL_TRAIN_FAULTS=hang=30:host=kh2, matched against the namespace's real host name): launch
# pins the hang on kh2 from the hang dumps, swaps kh4 in, and the run must end with the state
# fingerprint of the same run on shared memory in one namespace. Needs root; undoes everything it
# sets up (namespaces, bridge, /etc/hosts lines) on exit.
#
#   scripts/launch-hosts-namespaces.sh        (build/keel must exist)
set -euo pipefail
cd "$(dirname "$0")/.."
keel=$PWD/build/keel
tmp=$(mktemp -d)
hosts=(kh1 kh2 kh3 kh4)
cleanup() {
  for h in "${hosts[@]}"; do ip netns del "$h" 2>/dev/null || true; done
  ip link del khbr0 2>/dev/null || true
  sed -i '/ kh[1-4]$/d' /etc/hosts
  rm -rf "$tmp"
}
trap cleanup EXIT
cleanup
mkdir -p "$tmp"
ip link add khbr0 type bridge
ip link set khbr0 up
for i in 1 2 3 4; do
  h=kh$i
  ip netns add $h
  ip link add khv$i type veth peer name eth0 netns $h
  ip link set khv$i master khbr0 up
  ip -n $h addr add 10.9.1.$i/24 dev eth0
  ip -n $h link set eth0 up
  ip -n $h link set lo up
  echo "10.9.1.$i $h" >>/etc/hosts
done
cat >"$tmp/nsexec" <<'AGENT'
#!/bin/sh
host=$1; shift
exec ip netns exec "$host" unshare --uts sh -c "hostname $host; exec $*"
AGENT
chmod +x "$tmp/nsexec"
printf 'kh1 slots=1\nkh2 slots=1\nkh3 slots=1\nkh4 slots=1\n' >"$tmp/hosts"
args="train --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 \
  --micro-batch-size 2 --global-batch-size 12 --train-iters 40 --lr-warmup-iters 2 \
  --log-interval 10 --eval-interval 1000 --eval-iters 0 --threads 1 --sample-tokens 0 --guard off \
  --save-interval 10 --distributed-timeout-minutes 0.1 --first-iteration-timeout-minutes 2"
mca="--mca plm_rsh_agent $tmp/nsexec --mca btl tcp,self --mca btl_tcp_if_include 10.9.1.0/24 \
  --mca oob_tcp_if_include 10.9.1.0/24"
set +e
KEEL_TRAIN_FAULTS=hang=30:host=kh2 ip netns exec kh1 unshare --uts sh -c "hostname kh1; \
  timeout 300 $keel launch --backoff-seconds 0 --hostfile $tmp/hosts --spare-hosts 1 -- \
  mpirun --allow-run-as-root -x KEEL_TRAIN_FAULTS -np 3 $mca $keel $args --save $tmp/run" \
  >"$tmp/launch.log" 2>&1
rc=$?
set -e
grep -h "^launch: \|data parallel: MPI" "$tmp/launch.log" "$tmp/run/logs/"rank-*.log | cut -c1-240
tcp=$(sed -n 's/^state fingerprint: //p' "$tmp/launch.log" | tail -1)
timeout 120 mpirun --allow-run-as-root --oversubscribe --mca btl_vader_single_copy_mechanism none \
  -np 3 "$keel" $args --save "$tmp/shm" >"$tmp/shm.log" 2>&1
shm=$(sed -n 's/^state fingerprint: //p' "$tmp/shm.log")
echo "keel launch exit code: $rc"
echo "four namespaces, kh2 hung and replaced by kh4: state fingerprint $tcp"
echo "one namespace, shared memory, no fault:        state fingerprint $shm"
grep '"event":"host_excluded"' "$tmp/run/events.jsonl" | grep -q '"host":"kh2"'
[[ $rc == 0 && -n "$tcp" && "$tcp" == "$shm" ]]
