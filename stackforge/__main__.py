from stackforge.cli import main

main()
