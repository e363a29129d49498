#!/usr/bin/env bash
# Fetch Debian's stock kernel for the lab guest and unpack it into a cache directory inside the checkout.
# It is never installed on the host (that would touch /boot). Idempotent: once unpacked, nothing is downloaded.
#
# usage: fetch-kernel.sh CACHE_DIR      (CACHE_DIR/kernel/{vmlinuz,VERSION,lib/modules/VERSION})
set -euo pipefail
cache=${1:?usage: fetch-kernel.sh CACHE_DIR}
dest=$cache/kernel
mkdir -p "$cache"
if [[ -s $dest/VERSION && -f $dest/vmlinux && -f $dest/lib/modules/$(cat "$dest/VERSION")/modules.dep ]]; then
    echo "fetch-kernel: kernel $(cat "$dest/VERSION") already unpacked in $dest"
    exit 0
fi

resolve() { apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[0-9].*-amd64\)$/\1/p' | head -n1; }
pkg=$(resolve)
if [[ -z $pkg ]]; then
    echo "fetch-kernel: package lists do not know linux-image-amd64; running apt-get update"
    apt-get update -qq
    pkg=$(resolve)
fi
[[ -n $pkg ]] || { echo "fetch-kernel: cannot resolve linux-image-amd64 to a versioned kernel package" >&2; exit 1; }
version=${pkg#linux-image-}

work=$(mktemp -d "$cache/.fetch.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "fetch-kernel: downloading $pkg"
# apt-get download writes into the current directory; _apt cannot write into root-only dirs, which is harmless.
(cd "$work" && apt-get download -q "$pkg" 2>&1 | grep -v 'unsandboxed' || true)
deb=$(ls "$work"/*.deb 2>/dev/null | head -n1)
[[ -n $deb ]] || { echo "fetch-kernel: apt-get download $pkg produced no .deb" >&2; exit 1; }
dpkg -x "$deb" "$work/tree"
depmod -b "$work/tree" "$version"

rm -rf "$dest"
mkdir -p "$dest/lib"
mv "$work/tree/lib/modules" "$dest/lib/modules"
mv "$work/tree/boot/vmlinuz-$version" "$dest/vmlinuz"
mv "$work/tree/boot/config-$version" "$dest/config"
# Under TCG, decompressing the bzImage costs ~3 s of every boot. Keep the uncompressed ELF too: qemu boots it
# directly through its PVH entry point (CONFIG_PVH), so the guest starts in about half the time.
offset=$(LC_ALL=C grep -obUaP '\xfd7zXZ\x00' "$dest/vmlinuz" | head -n1 | cut -d: -f1 || true)
if [[ -n $offset ]] && grep -q '^CONFIG_PVH=y' "$dest/config"; then
    # xz stops at the end of its stream (the bzImage has trailing data), so read from a file, not a pipe.
    tail -c +$((offset + 1)) "$dest/vmlinuz" > "$work/payload.xz"
    xz -dc --single-stream "$work/payload.xz" > "$dest/vmlinux"
else
    echo "fetch-kernel: no xz payload or no PVH entry; the lab will boot the compressed kernel (slower)"
    cp "$dest/vmlinuz" "$dest/vmlinux"
fi
echo "$version" > "$dest/VERSION"
echo "fetch-kernel: kernel $version unpacked in $dest"
