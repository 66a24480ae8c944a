from eagle3conv.cli import main

main()
