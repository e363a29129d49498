#!/usr/bin/env bash
# Fetch Debian's kernel headers for the lab kernel (the bcc capture path compiles against them in the guest, where the
# kernel's BTF is hidden). Never installed on the host: unpacked into the cache as one merged tree (the common headers
# with the amd64 package's generated ones on top), which bcc takes from $BCC_KERNEL_SOURCE: bcc looks for
# include/linux/kconfig.h in that one directory, while Debian splits the tree in two (and its symlinks point to
# /usr/src, which the guest lacks). Idempotent: once unpacked, nothing is downloaded.
#
# usage: fetch-headers.sh CACHE_DIR      (reads CACHE_DIR/kernel/VERSION; writes CACHE_DIR/headers/VERSION)
set -euo pipefail
cache=${1:?usage: fetch-headers.sh CACHE_DIR}
version=$(cat "$cache/kernel/VERSION")
dest=$cache/headers/$version
if [[ -f $dest/include/generated/autoconf.h && -f $dest/include/linux/kconfig.h ]]; then
    echo "fetch-headers: headers of $version already unpacked in $dest"
    exit 0
fi
common=${version%-*}-common  # 6.1.0-56-amd64 -> 6.1.0-56-common
work=$(mktemp -d "$cache/.headers.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "fetch-headers: downloading linux-headers-$version linux-headers-$common"
(cd "$work" && apt-get download -q "linux-headers-$version" "linux-headers-$common" 2>&1 | grep -v 'unsandboxed' || true)
for pkg in "linux-headers-$version" "linux-headers-$common"; do
    deb=$(ls "$work"/"${pkg}"_*.deb 2>/dev/null | head -n1)
    [[ -n $deb ]] || { echo "fetch-headers: apt-get download $pkg produced no .deb" >&2; exit 1; }
    dpkg -x "$deb" "$work/tree"
done
tree=$work/tree/usr/src/linux-headers-$common
cp -a --remove-destination "$work/tree/usr/src/linux-headers-$version/." "$tree/"
rm -rf "$dest"
mkdir -p "$(dirname "$dest")"
mv "$tree" "$dest"
echo "fetch-headers: headers of $version in $dest"
