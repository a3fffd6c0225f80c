#!/usr/bin/env bash
# Builds the dfkv RDMA guest (tools/rdma-vm) from Debian's packages, or finds it cached:
# a trixie userland (packages.txt) with the trixie-backports kernel (its rxe runs inside
# network namespaces and it has udmabuf built in; bookworm's 6.1 does neither), packed as
# one zstd initramfs that is the whole root file system, plus the kernel image.
#
#   tools/rdma-vm/image.sh     prints the cache directory holding vmlinuz and initrd.cpio.zst
#
# Cache: ${DFKV_VM_CACHE:-~/.cache/dfkv/rdma-vm}/<key>/, key = sha256 of packages.txt, this
# script and init. DFKV_VM_MIRROR overrides the Debian mirror (default: the host's, else
# deb.debian.org).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${DFKV_VM_CACHE:-$HOME/.cache/dfkv/rdma-vm}
key=$(cat "$here/packages.txt" "$here/image.sh" "$here/init" | sha256sum | cut -c1-16)
dir=$cache/$key
log() { echo "rdma-vm image: $*" >&2; }
if [ -s "$dir/initrd.cpio.zst" ] && [ -s "$dir/vmlinuz" ]; then
  log "cached $dir ($(du -sh "$dir" | cut -f1))"
  echo "$dir"
  exit 0
fi
for t in mmdebstrap cpio zstd dpkg-deb; do
  command -v "$t" >/dev/null || { log "missing $t (apt-get install mmdebstrap cpio zstd)"; exit 1; }
done
mirror=${DFKV_VM_MIRROR:-}
if [ -z "$mirror" ]; then
  mirror=$(grep -hoE '(URIs:|deb) +https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/* 2>/dev/null |
    grep -v security | awk '{print $2}' | head -1 || true)
  mirror=${mirror:-http://deb.debian.org/debian}
fi
mirror=${mirror%/}
pkgs=$(grep -v '^#' "$here/packages.txt" | xargs | tr ' ' ,)
mkdir -p "$cache"
tmp=$(mktemp -d "$cache/build.XXXXXX")
[ "${DFKV_VM_KEEP:-0}" = 1 ] || trap 'rm -rf "$tmp"' EXIT
root=$tmp/root
log "building $key from $mirror (trixie + trixie-backports kernel): $pkgs"
t0=$(date +%s)
# The kernel is unpacked, not installed: installing it would run initramfs-tools, and the
# guest boots straight into this tree as its initramfs.
mkdir -p "$tmp/debs"
mmdebstrap --variant=apt --components=main --include="$pkgs" \
  --customize-hook='chroot "$1" sh -c "cd /tmp && apt-get download -q linux-image-amd64/trixie-backports >/dev/null"' \
  --customize-hook='k=$(dpkg-deb -f "$1"/tmp/linux-image-amd64_*.deb Depends | grep -oE "linux-image-[^ ,]+-amd64" | head -1) &&
    chroot "$1" sh -c "cd /tmp && apt-get download -q $k/trixie-backports >/dev/null" &&
    parts=$(dpkg-deb -f "$1"/tmp/"$k"_*.deb Depends | grep -oE "linux-(base|binary|modules)-[^ ,]+-amd64" | sort -u | xargs) &&
    echo "rdma-vm image: kernel package $k: $parts" >&2 &&
    chroot "$1" sh -c "cd /tmp && for p in $parts; do apt-get download -q \$p/trixie-backports >/dev/null || exit 1; done" &&
    rm "$1"/tmp/linux-image-amd64_*.deb' \
  --customize-hook="mv \"\$1\"/tmp/*.deb '$tmp/debs/'" \
  --customize-hook='chroot "$1" dpkg-query -W -f "\${Package} \${Version}\n" >"$1"/etc/dfkv-vm-packages' \
  trixie "$root" "deb $mirror trixie main" "deb $mirror trixie-backports main" >&2
kv=$(dpkg-deb -f "$(ls "$tmp"/debs/linux-image-*.deb | head -1)" Version)
echo "linux-image $kv" >>"$root/etc/dfkv-vm-packages"
for deb in "$tmp"/debs/*.deb; do dpkg-deb -x "$deb" "$tmp/kernel"; done
mods=$(find "$tmp/kernel" -type d -path '*/lib/modules/*' -prune | head -1)
kver=$(basename "$mods")
# Trixie-backports splits the kernel: vmlinuz in linux-binary-*, modules in linux-modules-*.
vmlinuz=$mods/vmlinuz
[ -e "$vmlinuz" ] || vmlinuz=$tmp/kernel/boot/vmlinuz-$kver
[ -n "$kver" ] && [ -e "$vmlinuz" ] || { log "no modules or vmlinuz in $(ls "$tmp/debs")"; exit 1; }
mv "$vmlinuz" "$tmp/vmlinuz"
mkdir -p "$root/usr/lib/modules"
mv "$mods" "$root/usr/lib/modules/$kver"
rm -rf "$tmp/kernel" "$tmp/debs"
log "kernel $kver; pruning modules the guest never loads"
m=$root/usr/lib/modules/$kver/kernel
rm -rf "$m"/sound "$m"/drivers/{gpu,media,staging,scsi,usb,bluetooth,iio,hid,input,isdn,md,mmc,mtd,nfc,platform,power,pinctrl,thermal,video,watchdog,hwmon,misc,spi,i2c,ata,target,nvme,edac,leds,mfd,regulator,rtc,thunderbolt,w1,comedi,firewire,gnss,hv,xen,fpga,bus,crypto,tty,parport,pcmcia,ssb,bcma,uio,vfio,vhost,block,cdrom,accel,acpi,atm,auxdisplay,base,char,clk,cpufreq,dca,extcon,firmware,gpio,hsi,memstick,mailbox,mux,ntb,nvdimm,pci,perf,phy,pps,ptp,rapidio,remoteproc,reset,soundwire,ufs,vdpa,virt}
rm -rf "$m"/drivers/net/{wireless,ethernet,usb,can,wan,ieee802154,wwan,phy,pcs,mdio,hamradio,arcnet,fddi,plip,slip,ppp,team,bonding,fjes,hyperv,xen-netback,dsa,ipa,mhi,netdevsim,thunderbolt,wireguard}
rm -rf "$m"/fs/{btrfs,xfs,ext4,jfs,nfs,nfsd,ocfs2,gfs2,f2fs,ntfs3,ubifs,smb,ceph,cifs,afs,coda,orangefs,nilfs2,reiserfs,hfs,hfsplus,udf,isofs,bcachefs,erofs,squashfs,jffs2,zonefs,dlm,ufs,minix,befs,efs,qnx4,qnx6,romfs,sysv,omfs,adfs,affs,cramfs,exfat,fat,vboxsf,quota,lockd,nls,fuse}
rm -rf "$m"/net/{wireless,mac80211,bluetooth,nfc,sunrpc,ceph,can,ieee802154,mac802154,6lowpan,rxrpc,atm,tipc,dsa,l2tp,netrom,rose,ax25,appletalk,x25,batman-adv,caif,rfkill,smc,mptcp}
chroot "$root" depmod "$kver"
rm -rf "$root"/boot/* "$root"/usr/share/{doc,man,info,locale,i18n,lintian,bash-completion,zoneinfo} \
  "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/var/log/*
find "$root" -name __pycache__ -prune -exec rm -rf {} +
install -m 0755 "$here/init" "$root/init"
echo dfkv-vm >"$root/etc/hostname"
printf '127.0.0.1 localhost dfkv-vm\n::1 localhost\n' >"$root/etc/hosts"
log "packing the initramfs ($(du -sh "$root" | cut -f1) unpacked)"
(cd "$root" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet | zstd -q -T2 -10 -o "$tmp/initrd.cpio.zst")
grep -E '^(linux-image[^ ]*|rdma-core|ibverbs-providers|libibverbs1) ' "$root/etc/dfkv-vm-packages" >"$tmp/versions" || true
echo "kernel $kver" >>"$tmp/versions"
rm -rf "$root"
rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
log "built $dir in $(($(date +%s) - t0)) s ($(du -sh "$dir/initrd.cpio.zst" | cut -f1) initramfs)"
echo "$dir"
