# Sourced by rdma-suite.sh: the routed RoCE v2 fabric and the one-host two-NIC shape, each
# a real dfkv_server and dfkv_bench --transport rdma --verify (which fails unless RDMA is
# in use) PUT then GET 1 B – 8 MiB; and the DMA-BUF probe.

# wait_gid NS DEV IP NETDEV...: waits (at most 10 s) until DEV's port is ACTIVE, its GID
# table holds IP's IPv4-mapped GID and no NETDEV has a tentative IPv6 address left (duplicate
# address detection done: a link-local GID, which a peer on the same host uses, resolves only
# then). NS "-" is the initial namespace. rxe fills the table from the netdev's addresses
# after `rdma link add`; a QP brought up before that failed RTR with "connection timed out"
# (twonic's first PUT; TestLoopback, the l2 fabric's first test, 8 s after boot).
wait_gid() {
  ns=$1 dev=$2 ip=$3
  shift 3
  nsrun() { if [ "$ns" = - ]; then "$@"; else ip netns exec "$ns" "$@"; fi; }
  want=$(printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' $(echo "$ip" | tr . ' '))
  p=/sys/class/infiniband/$dev/ports/1
  for _ in $(seq 100); do
    settled=1
    nsrun sh -c "grep -q ACTIVE $p/state && cat $p/gids/[0-7] 2>/dev/null | grep -qx $want" || settled=0
    for nd in "$@"; do
      [ -z "$(nsrun ip -6 addr show dev "$nd" tentative)" ] || settled=0
    done
    [ $settled = 1 ] && return 0
    sleep 0.1
  done
  say "$dev in $ns: not ACTIVE with GID $want and no tentative address on $* after 10 s"
  nsrun sh -c "cat $p/state; cat $p/gids/[0-3]" 2>&1 | sed 's/^/  /'
  for nd in "$@"; do nsrun ip addr show dev "$nd" 2>&1 | sed 's/^/  /'; done
  return 1
}

# bench_pair NAME SRV_NS SRV_IP SRV_DEV CLI_NS CLI_DEV: one shape's round of sizes.
bench_pair() {
  name=$1 sns=$2 sip=$3 sdev=$4 cns=$5 cdev=$6
  d=/tmp/$name
  mkdir -p $d
  t0=$(date +%s)
  ip netns exec "$sns" $bin/dfkv_server --host "$sip" --port 0 --addr-file $d/addr --dir $d/data --cap 256MiB \
    --max-msg 16MiB --rdma --rdma-provider ibverbs --rdma-dev "$sdev" --log-level info ${DFKV_GUEST_SERVER_FLAGS:-} >/out/$name-server.log 2>&1 &
  spid=$!
  for _ in $(seq 150); do [ -s $d/addr ] && break; sleep 0.2; done
  ok=0 bad=0
  if [ -s $d/addr ]; then
    for size in 1 4097 1MiB 8MiB; do
      for op in put get; do
        if timeout 120 ip netns exec "$cns" $bin/dfkv_bench --node "$(cat $d/addr)" --transport rdma --rdma-provider ibverbs \
          --rdma-dev "$cdev" --op $op --size $size --keys 4 --count 8 --conns 1 --warmup 0s --io-timeout 30s --verify \
          >>/out/$name-bench.log 2>&1; then
          ok=$((ok + 1))
        else
          bad=$((bad + 1))
          echo "rdma-suite: $name: $op $size FAILED" | tee -a /out/$name-bench.log
        fi
      done
    done
  else
    bad=1
    say "$name: the server did not start"
  fi
  kill $spid 2>/dev/null
  wait $spid 2>/dev/null
  grep -iE 'rdma|error|refus' /out/$name-server.log | head -10 | sed 's/^/  server| /'
  grep -E 'FAILED|transport|error|p50' /out/$name-bench.log | head -16 | sed 's/^/  bench| /'
  [ $bad = 0 ] || status=1
  echo "$name passed $ok failed $bad skipped 0 seconds $(($(date +%s) - t0))" >>/out/counts
}

fabric_routed() {
  say "step: fabric routed (netns cli 10.1.0.0/24 -- rtr -- srv 10.2.0.0/24, forwarding on)"
  for n in cli rtr srv; do ip netns add $n; ip -n $n link set lo up; done
  ip link add vc type veth peer name rc
  ip link add vs type veth peer name rs
  ip link set vc netns cli; ip link set rc netns rtr; ip link set vs netns srv; ip link set rs netns rtr
  ip -n cli addr add 10.1.0.2/24 dev vc; ip -n rtr addr add 10.1.0.1/24 dev rc
  ip -n srv addr add 10.2.0.2/24 dev vs; ip -n rtr addr add 10.2.0.1/24 dev rs
  for p in cli:vc rtr:rc rtr:rs srv:vs; do ip -n ${p%%:*} link set ${p#*:} up; done
  ip -n cli route add default via 10.1.0.1
  ip -n srv route add default via 10.2.0.1
  ip netns exec rtr sysctl -qw net.ipv4.ip_forward=1
  ip netns exec cli rdma link add rxec type rxe netdev vc
  ip netns exec srv rdma link add rxes type rxe netdev vs
  wait_gid cli rxec 10.1.0.2 vc || status=1
  wait_gid srv rxes 10.2.0.2 vs || status=1
  ip netns exec cli ping -c1 -W5 10.2.0.2 >/dev/null && say "routed: ping across the router ok"
  for n in cli srv; do
    ip netns exec $n ibv_devinfo 2>/dev/null | grep -E 'hca_id|state' | sed "s/^/  $n: /"
    d=rxe$(echo $n | cut -c1)
    ip netns exec $n sh -c "for g in /sys/class/infiniband/$d/ports/1/gids/[0-3]; do echo \"  $n $d gid \$(basename \$g) \$(cat \$g)\"; done" 2>/dev/null
  done
  # Control: rdma-core's own pingpong crosses the router on the IPv4-mapped GID (index 1).
  (ip netns exec srv timeout 60 ibv_rc_pingpong -d rxes -g 1 -n 10 >/out/pingpong-srv.log 2>&1 &)
  sleep 1
  if ip netns exec cli timeout 60 ibv_rc_pingpong -d rxec -g 1 -n 10 10.2.0.2 >/out/pingpong-cli.log 2>&1; then
    say "routed: ibv_rc_pingpong -g 1 across the router ok"
  else
    say "routed: ibv_rc_pingpong -g 1 across the router FAILED"; tail -3 /out/pingpong-cli.log | sed 's/^/  /'
  fi
  bench_pair routed srv 10.2.0.2 rxes cli rxec
}

fabric_twonic() {
  say "step: fabric twonic (one netns, two NICs: server on rxea/10.3.0.1, client on rxeb/10.3.0.2)"
  ip netns add two
  ip -n two link set lo up
  ip -n two link add ta type veth peer name tb
  ip -n two addr add 10.3.0.1/24 dev ta
  ip -n two addr add 10.3.0.2/24 dev tb
  ip -n two link set ta up; ip -n two link set tb up
  ip netns exec two rdma link add rxea type rxe netdev ta
  ip netns exec two rdma link add rxeb type rxe netdev tb
  wait_gid two rxea 10.3.0.1 ta || status=1
  wait_gid two rxeb 10.3.0.2 tb || status=1
  bench_pair twonic two 10.3.0.1 rxea two rxeb
}

probe_dmabuf() {
  say "step: DMA-BUF probe (udmabuf + ibv_reg_dmabuf_mr on rxe0)"
  $bin/dmabuf_probe rxe0 | tee /out/dmabuf.txt
}
