#!/bin/bash
# `make package`: the wheel (with the compiled CO-RE object as package data), the Debian package and the Ansible
# role's tarball, into dist/.
# The checkout is never modified: both are built from a staged copy that has the object under cachepilot/data/.
# Reproducible: every timestamp is SOURCE_DATE_EPOCH (default: the last commit's time), file order and owners are
# fixed, so two builds of one commit are byte-identical (the role pins the .deb's SHA-256).
#   controller/packaging/build-package.sh ROOT PYTHON [VERSION]   (VERSION: default cachepilot.__version__)
set -euo pipefail
root=$(cd "$1" && pwd)
py=$2
obj=$root/bpf/.output/cachepilot.bpf.o
[ -f "$obj" ] || { echo "package: $obj not built (make bpf)"; exit 1; }
version=${3:-$("$py" -c 'import sys; sys.path.insert(0, sys.argv[1]); import cachepilot; print(cachepilot.__version__)' \
	"$root/controller")}
# one spelling both PEP 440 and Debian read the same way (no epoch, no letters): 0.1.3, 1.2.3.4
[[ $version =~ ^[0-9]+(\.[0-9]+){1,3}$ ]] || { echo "package: VERSION $version is not N.N[.N[.N]]"; exit 1; }
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
	SOURCE_DATE_EPOCH=$(git -C "$root" log -1 --format=%ct 2>/dev/null) \
		|| { echo "package: no git history for SOURCE_DATE_EPOCH: set it"; exit 1; }
fi
export SOURCE_DATE_EPOCH
export TZ=UTC LC_ALL=C.UTF-8 PYTHONHASHSEED=0
umask 022
dist=$root/dist
work=$root/build/package
rm -rf "$work" && mkdir -p "$work/src" "$dist"

# debian/changelog as shipped: a build of another version than its top entry gets an entry of its own on top,
# dated SOURCE_DATE_EPOCH (a distribution's tools then see the version they install)
changelog() {
	local top
	top=$(sed -n '1s/^cachepilot (\([^)]*\)).*/\1/p' "$1")
	if [ "$top" != "$version" ]; then
		printf 'cachepilot (%s) unstable; urgency=medium\n\n  * Built at version %s from commit %s.\n\n -- %s  %s\n\n' \
			"$version" "$version" "$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)" \
			"$(sed -n 's/^Maintainer: //p' "$root/controller/packaging/debian/control")" \
			"$(date -u -R -d "@$SOURCE_DATE_EPOCH")"
	fi
	cat "$1"
}

# --- the wheel ---------------------------------------------------------------------------------------------------
tar -C "$root" --exclude='*.egg-info' --exclude=__pycache__ -cf - pyproject.toml README.md controller |
	tar -C "$work/src" -xf -
install -m 0644 "$obj" "$work/src/controller/cachepilot/data/cachepilot.bpf.o"
# the version asked for, in the staged copy only (the wheel's metadata and --version read it from there)
sed -i "s/^__version__ = .*/__version__ = \"$version\"/" "$work/src/controller/cachepilot/__init__.py"
# the bcc capture path's sources (kernels without BTF compile them against their headers: probe/bccload.py)
install -d "$work/src/controller/cachepilot/data/bcc"
install -m 0644 "$root"/bpf/cachepilot.bcc.c "$root"/bpf/cachepilot.h "$root"/bpf/*.bpf.h \
	"$work/src/controller/cachepilot/data/bcc/"
rm -f "$dist"/cachepilot-"$version"-*.whl
"$py" -m pip wheel -q --no-deps -w "$dist" "$work/src"
wheel=$dist/cachepilot-$version-py3-none-any.whl
"$py" -c 'import sys, zipfile; sys.exit(sys.argv[2] not in zipfile.ZipFile(sys.argv[1]).namelist())' \
	"$wheel" cachepilot/data/cachepilot.bpf.o || { echo "package: no object in $wheel"; exit 1; }
"$py" -c 'import sys, zipfile; sys.exit(sys.argv[2] not in zipfile.ZipFile(sys.argv[1]).namelist())' \
	"$wheel" cachepilot/data/bcc/cachepilot.bcc.c || { echo "package: no bcc source in $wheel"; exit 1; }

# --- the Debian package: the wheel's files under Debian's Python, its modules from Debian ------------------------
deb=$work/deb
site=$deb/usr/lib/python3/dist-packages
mkdir -p "$site" "$deb/usr/bin" "$deb/lib/systemd/system" "$deb/etc/cachepilot" "$deb/usr/share/man/man8" \
	"$deb/usr/share/doc/cachepilot/examples" "$deb/DEBIAN"
"$py" -m zipfile -e "$wheel" "$site"
install -m 0755 "$root/controller/packaging/debian/cachepilot" "$deb/usr/bin/cachepilot"
# the unit names the program where the package puts it (the pip/Ansible install's copy says /usr/local/bin)
sed 's#/usr/local/bin/cachepilot#/usr/bin/cachepilot#g' "$root/controller/cachepilot/data/cachepilot.service" \
	> "$deb/lib/systemd/system/cachepilot.service"
# the example configuration runs the shipped default policy from /etc, where the operator edits it
sed 's#^policies: \[\] #policies: [/etc/cachepilot/policy.yaml]#' "$root/controller/cachepilot/data/config.yaml" \
	> "$deb/etc/cachepilot/config.yaml"
grep -q '^policies: \[/etc/cachepilot/policy.yaml\]' "$deb/etc/cachepilot/config.yaml" \
	|| { echo "package: data/config.yaml has no 'policies: [] ' line to point at the policy"; exit 1; }
install -m 0644 "$root/policies/default.yaml" "$deb/etc/cachepilot/policy.yaml"
install -m 0644 "$root"/policies/examples-*.yaml "$root/policies/schema.json" "$deb/usr/share/doc/cachepilot/examples/"
# the man page from the program's own parser (every command, as this build's code has them: it cannot drift)
date=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%d)
PYTHONPATH=$work/src/controller "$py" -B "$root/controller/packaging/manpage.py" \
	"$root/controller/packaging/debian/cachepilot.8.in" "$version" "$date" | gzip -9n > "$deb/usr/share/man/man8/cachepilot.8.gz"
install -m 0644 "$root/controller/packaging/debian/copyright" "$deb/usr/share/doc/cachepilot/copyright"
changelog "$root/controller/packaging/debian/changelog" | gzip -9n > "$deb/usr/share/doc/cachepilot/changelog.Debian.gz"
for f in preinst postinst prerm postrm; do
	sed "s/@VERSION@/$version/" "$root/controller/packaging/debian/$f" > "$deb/DEBIAN/$f" && chmod 0755 "$deb/DEBIAN/$f"
done
install -m 0644 "$root/controller/packaging/debian/conffiles" "$deb/DEBIAN/conffiles"
find "$deb" -name __pycache__ -prune -exec rm -rf {} +  # compiled on the host by whoever imports first, not shipped
size=$(du -sk --apparent-size --exclude=DEBIAN "$deb" | cut -f1)
sed -e "s/@VERSION@/$version/" -e "s/@SIZE@/$size/" "$root/controller/packaging/debian/control" > "$deb/DEBIAN/control"
find "$deb" -type d -exec chmod 0755 {} + && find "$deb" -type f ! -perm -u+x -exec chmod 0644 {} +
find "$deb" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
out=$dist/cachepilot_${version}_amd64.deb
dpkg-deb --root-owner-group -Zxz --build "$deb" "$out" >/dev/null
# --- the Ansible role, as ansible-galaxy installs it: the files its symlinks name copied in ------------------------
role=$dist/cachepilot-role-$version.tar.gz
tar -C "$root/playbooks/roles" --dereference --exclude=__pycache__ --owner=0 --group=0 --numeric-owner \
	--sort=name --mtime="@$SOURCE_DATE_EPOCH" --mode=go-w -cf - cachepilot | gzip -9n > "$role"
# --- the Ansible collection cachepilot.cachepilot (ansible-galaxy collection install dist/cachepilot-cachepilot-*) ------
collection=$("$root/controller/packaging/build-collection.sh" "$root" "$version" "$dist")
echo "package: $wheel"
echo "package: $collection"
echo "package: $role"
echo "package: $out"
