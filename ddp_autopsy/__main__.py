from ddp_autopsy.cli import main

main()
