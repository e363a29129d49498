#!/bin/bash
# The Ansible collection cachepilot.cachepilot: the role (its symlinks' targets copied in), the site, prometheus and
# teardown playbooks (their role references made fully qualified), the rules builder, the dashboard and the
# runbooks, built by ansible-galaxy into OUT (cachepilot-cachepilot-VERSION.tar.gz).
#   controller/packaging/build-collection.sh ROOT VERSION OUT
set -euo pipefail
root=$(cd "$1" && pwd)
version=$2
out=$3
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
c=$stage/cachepilot
mkdir -p "$c/roles" "$c/playbooks" "$c/meta" "$c/files/prometheus" "$c/files/grafana"
sed "s/@VERSION@/$version/" "$root/controller/packaging/collection/galaxy.yml" > "$c/galaxy.yml"
cp "$root/controller/packaging/collection/README.md" "$c/README.md"
printf -- '---\nrequires_ansible: ">=2.14"\n' > "$c/meta/runtime.yml"
cp -rL "$root/playbooks/roles/cachepilot" "$c/roles/cachepilot"
# a role in a collection finds its modules among the collection's plugins (its own collection is searched first)
mkdir -p "$c/plugins/modules"
mv "$c"/roles/cachepilot/library/*.py "$c/plugins/modules/" && rmdir "$c/roles/cachepilot/library"
cp -r "$root/playbooks/templates" "$root/playbooks/inventory" "$c/playbooks/"
for book in site prometheus teardown; do
	# a playbook in a collection finds the role by its full name
	sed -E 's/^(\s+(- role|name)): cachepilot$/\1: cachepilot.cachepilot.cachepilot/' \
		"$root/playbooks/$book.yml" > "$c/playbooks/$book.yml"
done
cp "$root/dashboards/prometheus/build_rules.py" "$root/dashboards/prometheus/cachepilot.rules.yml" "$c/files/prometheus/"
cp -r "$root/dashboards/grafana/cachepilot.json" "$root/dashboards/grafana/provisioning" "$c/files/grafana/"
cp -r "$root/dashboards/runbooks" "$c/files/runbooks"
find "$c" -name __pycache__ -prune -exec rm -rf {} +
mkdir -p "$out"
ansible-galaxy collection build --force --output-path "$out" "$c" >/dev/null
echo "$out/cachepilot-cachepilot-$version.tar.gz"
