# Runs inside the guest (tools/rdma-vm/init calls it from the read-only share): the guest
# script with its arguments and the host's DFKV_TEST_*/DFKV_GUEST_* variables, under the
# run's deadline; its status goes to /out/status for run.sh.
d=/host/.dfkv-vm
[ -f $d/env ] && . $d/env
t=$(cat $d/timeout)
set --
while IFS= read -r a; do set -- "$@" "$a"; done <$d/args
echo "dfkv-vm: guest: $(nproc) CPUs, $(awk '/MemTotal/{print int($2/1024)}' /proc/meminfo) MiB; running the script (deadline $t s)"
# The tests' data directories live in /tmp (RAM): let it use most of the guest's memory.
mount -o remount,size=75% /tmp
cd /tmp
timeout -k 10 "$t" sh $d/script "$@"
rc=$?
[ $rc = 124 ] && echo "dfkv-vm: guest: the script ran past its $t s deadline"
echo "dfkv-vm: guest: script exited $rc"
echo $rc >/out/status
sync
