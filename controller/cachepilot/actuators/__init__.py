"""Actuators: what the controller does to a volume besides control writes — FITRIM of freed extents
(``discard``) and promotion by reading (``promote``). Neither ever writes user data."""
