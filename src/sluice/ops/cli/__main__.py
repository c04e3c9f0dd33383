from sluice.ops.cli import main

main()
