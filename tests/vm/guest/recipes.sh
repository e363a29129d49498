# Volume recipes for the lab guest, sourced by stage2.sh. Disks: /dev/vda = origin (slow), /dev/vdb = cache (fast).
# Both are wrapped in device-mapper devices so a test can slow the origin (dm-delay) or fail the cache
# (dm-error / dm-flakey, see lab-fail-cache) without touching the volume built on top of them.
# Each step sets LAB_STEP first, so a failure names the step.

LAB_MOUNT=/mnt/lab
run_step() {  # run_step "description" cmd args...
    LAB_STEP=$1; shift
    "$@" >> /tmp/recipe.log 2>&1 || { echo "lab: step '$LAB_STEP' failed: $*" >&2; tail -n 5 /tmp/recipe.log >&2; return 1; }
}

wait_for() {  # wait_for PATH: devices appear asynchronously after registration
    local i
    for i in $(seq 1 200); do [[ -e $1 ]] && return 0; sleep 0.05; done
    echo "lab: $1 did not appear" >&2; return 1
}

base_devices() {
    run_step "load device-mapper" modprobe -a dm-mod dm-delay || return 1
    local osz csz
    osz=$(blockdev --getsz /dev/vda); csz=$(blockdev --getsz /dev/vdb)
    if [[ -n ${LAB_ORIGIN_DELAYS:-} ]]; then
        local r w f; read -r r w f <<< "$LAB_ORIGIN_DELAYS"
        # dm-delay's 9-argument table: reads, writes and flushes each with their own delay.
        run_step "dm-delay under the origin (read $r, write $w, flush $f ms)" dmsetup create lab-origin \
            --table "0 $osz delay /dev/vda 0 $r /dev/vda 0 $w /dev/vda 0 $f" || return 1
    elif (( ${LAB_ORIGIN_DELAY_MS:-0} > 0 )); then
        run_step "dm-delay under the origin" dmsetup create lab-origin \
            --table "0 $osz delay /dev/vda 0 $LAB_ORIGIN_DELAY_MS" || return 1
    else
        run_step "origin mapping" dmsetup create lab-origin --table "0 $osz linear /dev/vda 0" || return 1
    fi
    run_step "cache device mapping" dmsetup create lab-cache --table "0 $csz linear /dev/vdb 0" || return 1
    export LAB_ORIGIN_DEV=/dev/mapper/lab-origin LAB_CACHE_DEV=/dev/mapper/lab-cache LAB_CACHE_BACKING=/dev/vdb
}

mkfs_and_mount() {
    run_step "mkfs.ext4 on $LAB_CACHED_DEV" mkfs.ext4 -q -F -E nodiscard,lazy_itable_init=0,lazy_journal_init=1 "$LAB_CACHED_DEV" || return 1
    mkdir -p "$LAB_MOUNT"
    run_step "mount $LAB_CACHED_DEV" mount -t ext4 "$LAB_CACHED_DEV" "$LAB_MOUNT" || return 1
    export LAB_MOUNT
}

recipe_bcache() {
    run_step "load bcache" modprobe bcache || return 1
    run_step "make-bcache" make-bcache --wipe-bcache --bucket 64k -C "$LAB_CACHE_DEV" -B "$LAB_ORIGIN_DEV" || return 1
    LAB_STEP="register bcache devices"
    echo "$LAB_CACHE_DEV" > /sys/fs/bcache/register || return 1
    echo "$LAB_ORIGIN_DEV" > /sys/fs/bcache/register || return 1
    wait_for /sys/block/bcache0/bcache/cache || return 1
    wait_for /dev/bcache0 || return 1
    export LAB_CACHED_DEV=/dev/bcache0 LAB_BCACHE_SYSFS=/sys/block/bcache0/bcache
    LAB_BCACHE_CSET=$(readlink -f /sys/block/bcache0/bcache/cache); export LAB_BCACHE_CSET
    if [[ -n ${LAB_MODE:-} ]]; then
        LAB_STEP="set cache_mode $LAB_MODE"
        echo "$LAB_MODE" > /sys/block/bcache0/bcache/cache_mode || return 1
    fi
    mkfs_and_mount
}

recipe_dmcache() {
    run_step "load dm-cache" modprobe -a dm-cache dm-cache-smq || return 1
    local csz meta=32768 osz   # 16 MiB of metadata, the rest is cache blocks
    csz=$(blockdev --getsz "$LAB_CACHE_DEV"); osz=$(blockdev --getsz "$LAB_ORIGIN_DEV")
    run_step "metadata slice" dmsetup create lab-cmeta --table "0 $meta linear $LAB_CACHE_DEV 0" || return 1
    run_step "data slice" dmsetup create lab-cdata --table "0 $((csz - meta)) linear $LAB_CACHE_DEV $meta" || return 1
    run_step "zero the metadata" dd if=/dev/zero of=/dev/mapper/lab-cmeta bs=1M count=1 oflag=direct || return 1
    run_step "dm-cache target" dmsetup create lab-cached --table \
        "0 $osz cache /dev/mapper/lab-cmeta /dev/mapper/lab-cdata $LAB_ORIGIN_DEV 128 1 ${LAB_MODE:-writeback} smq 0" || return 1
    export LAB_CACHED_DEV=/dev/mapper/lab-cached LAB_DM_NAME=lab-cached \
        LAB_CACHE_META_DEV=/dev/mapper/lab-cmeta LAB_CACHE_DATA_DEV=/dev/mapper/lab-cdata
    mkfs_and_mount
}

recipe_writecache() {
    [[ -z ${LAB_MODE:-} || $LAB_MODE == writeback ]] || { LAB_STEP="mode check"; echo "lab: dm-writecache is write-back only" >&2; return 1; }
    run_step "load dm-writecache" modprobe dm-writecache || return 1
    local osz; osz=$(blockdev --getsz "$LAB_ORIGIN_DEV")
    # The cache device must start zeroed ("Invalid magic in the superblock" otherwise).
    run_step "zero the cache superblock" dd if=/dev/zero of="$LAB_CACHE_DEV" bs=1M count=1 oflag=direct || return 1
    run_step "dm-writecache target" dmsetup create lab-cached --table \
        "0 $osz writecache s $LAB_ORIGIN_DEV $LAB_CACHE_DEV 4096 0" || return 1
    export LAB_CACHED_DEV=/dev/mapper/lab-cached LAB_DM_NAME=lab-cached
    mkfs_and_mount
}

# An LVM cache LV (lvmcache, lvconvert --type cache) on the origin and cache mappings. Its own lvm.conf (exported
# as LVM_SYSTEM_DIR, so cachepilot's lvchange calls in the test read it too): only the two mappings are PVs (the
# disks below them carry the same PV labels), and no udev in the guest: libdevmapper makes the nodes itself
# (DM_DISABLE_UDEV, as cachepilot runs lvchange). The cache pool has no spare metadata LV.
recipe_lvmcache() {
    run_step "load dm-cache" modprobe -a dm-cache dm-cache-smq || return 1
    export DM_DISABLE_UDEV=1 LVM_SYSTEM_DIR=/tmp/lab-lvm
    mkdir -p "$LVM_SYSTEM_DIR"
    cat > "$LVM_SYSTEM_DIR/lvm.conf" <<'CONF'
devices {
    filter = [ "a|^/dev/mapper/lab-origin$|", "a|^/dev/mapper/lab-cache$|", "r|.*|" ]
    obtain_device_list_from_udev = 0
    use_devicesfile = 0
}
activation {
    udev_sync = 0
    udev_rules = 0
}
backup {
    backup = 0
    archive = 0
}
CONF
    run_step "pvcreate" lvm pvcreate -y -ff "$LAB_ORIGIN_DEV" "$LAB_CACHE_DEV" || return 1
    run_step "vgcreate" lvm vgcreate labvg "$LAB_ORIGIN_DEV" "$LAB_CACHE_DEV" || return 1
    run_step "origin LV" lvm lvcreate -y -n cached -l 100%PVS labvg "$LAB_ORIGIN_DEV" || return 1
    run_step "cache pool" lvm lvcreate -y --type cache-pool --poolmetadataspare n --chunksize 64k \
        -n cpool -l 100%PVS labvg "$LAB_CACHE_DEV" || return 1
    run_step "lvconvert --type cache" lvm lvconvert -y --type cache --cachepool labvg/cpool \
        --cachemode "${LAB_MODE:-writeback}" --cachepolicy smq labvg/cached || return 1
    wait_for /dev/mapper/labvg-cached || return 1
    export LAB_CACHED_DEV=/dev/mapper/labvg-cached LAB_DM_NAME=labvg-cached LAB_LV=labvg/cached
    mkfs_and_mount
}

build_volume() {
    LAB_STEP="base devices"
    export LAB_RECIPE
    case $LAB_RECIPE in
        none) base_devices ;;
        bcache|dmcache|writecache|lvmcache) base_devices && "recipe_$LAB_RECIPE" ;;
        *) LAB_STEP="recipe name"; echo "lab: unknown recipe '$LAB_RECIPE'" >&2; return 1 ;;
    esac
}
