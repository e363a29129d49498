"""The daemon (`cachepilot run`): the tick loop, its configuration, volume discovery, the state file, the lock,
the control socket and systemd notification. ``daemon.py`` joins them; each other module is one concept."""
