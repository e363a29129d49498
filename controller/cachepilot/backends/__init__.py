"""Backends: one module per kind of kernel cache (bcache, dm-cache, dm-writecache), each reading the cache's
state and applying actions through the interfaces the stock kernel already has (sysfs, dmsetup)."""
