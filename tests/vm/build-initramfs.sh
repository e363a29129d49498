#!/usr/bin/env bash
# Build the lab guest's initramfs: busybox-static as PID 1 plus the few modules needed to reach the host's
# root over virtio-9p (virtio, 9p, overlay). Everything else comes from the host's root and the unpacked
# module tree once the guest has switched root. Rebuilt only when its inputs change.
#
# usage: build-initramfs.sh CACHE_DIR      (needs CACHE_DIR/kernel from fetch-kernel.sh)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${1:?usage: build-initramfs.sh CACHE_DIR}
kdir=$cache/kernel
out=$cache/initramfs.cpio
[[ -s $kdir/VERSION ]] || { echo "build-initramfs: no kernel in $kdir; run 'make deps-lab' (tests/vm/fetch-kernel.sh)" >&2; exit 1; }
busybox=$(command -v busybox || true)
[[ -n $busybox ]] && file -L "$busybox" 2>/dev/null | grep -q 'statically linked' || busybox=/bin/busybox
[[ -x $busybox ]] || { echo "build-initramfs: busybox-static is missing; run 'make deps-system'" >&2; exit 1; }
version=$(cat "$kdir/VERSION")
mods=$kdir/lib/modules/$version

# The modules to reach the root, in dependency order (modules.dep lists a module's dependencies after it).
wanted=(virtio_pci virtio_blk 9pnet_virtio 9p overlay)
stamp_inputs=$(cat "$here/initramfs-init" "$busybox" "$kdir/VERSION" | sha256sum | cut -c1-16)
if [[ -f $out && -f $out.stamp && $(cat "$out.stamp") == "$stamp_inputs" ]]; then
    echo "build-initramfs: $out is up to date"
    exit 0
fi

declare -A seen=()
ordered=()
add() {  # depth-first: dependencies before the module itself
    local rel=$1 dep
    [[ -n ${seen[$rel]:-} ]] && return
    seen[$rel]=1
    for dep in $(awk -v m="$rel:" '$1 == m { $1 = ""; print }' "$mods/modules.dep"); do add "$dep"; done
    ordered+=("$rel")
}
for name in "${wanted[@]}"; do
    rel=$(awk -F: -v n="/$name.ko" 'index($1, n) && substr($1, length($1) - length(n) + 1) == n { print $1; exit }' "$mods/modules.dep")
    [[ -n $rel ]] || { echo "build-initramfs: module $name not found in $mods" >&2; exit 1; }
    add "$rel"
done

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root"/{bin,dev,proc,sys,lower,rw,newroot,modules}
cp "$busybox" "$root/bin/busybox"
ln -s busybox "$root/bin/sh"
install -m 0755 "$here/initramfs-init" "$root/init"
: > "$root/modules/order"
for rel in "${ordered[@]}"; do
    cp "$mods/$rel" "$root/modules/"
    basename "$rel" >> "$root/modules/order"
done
(cd "$root" && find . -print0 | cpio --null -o -H newc --quiet) > "$out.tmp"
mv "$out.tmp" "$out"
echo "$stamp_inputs" > "$out.stamp"
echo "build-initramfs: $out ($(du -h "$out" | cut -f1), modules: $(tr '\n' ' ' < "$root/modules/order"))"
