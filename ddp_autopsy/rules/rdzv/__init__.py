"""Start-up: rendezvous, TCPStore, master address and port."""
