from benchbatch.start import main

main()
