"""Configuration: versions, world size, addresses, backends that disagree across ranks."""
