from benchbatch.cli import main

main()
