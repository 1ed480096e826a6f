"""Draft of videokv-tiny's noun table (issue 34): ImageNet-1k class -> the plain noun a planner uses.

    python scripts/draft_noun_table.py > videokv_node/videokv_node/models/weights/videokv-tiny/nouns.tsv

Rules first (index ranges for animals: every dog breed -> dog, every cat breed -> cat, ...), then
objects by their first synonym, then the hand review (``HAND``: the classes a robot's camera meets in
a home, an office, a street, food; ``''`` for classes a robot user would not name). The committed
table is the artifact (tests/unit/test_noun_table.py checks its shape and hand-written rows); this
script records how its draft was made.
"""

from __future__ import annotations

import sys
from pathlib import Path

RANGES = [  # (first, last) inclusive ImageNet indices -> noun
    (0, 1, "fish"), (2, 4, "shark"), (5, 6, "fish"), (7, 8, "chicken"), (9, 9, "ostrich"), (10, 21, "bird"),
    (22, 23, "bird"), (24, 24, "owl"), (25, 29, "salamander"), (30, 32, "frog"), (33, 37, "turtle"),
    (38, 48, "lizard"), (49, 50, "crocodile"), (51, 51, "dinosaur"), (52, 68, "snake"), (69, 69, ""),
    (70, 70, "spider"), (71, 71, "scorpion"), (72, 77, "spider"), (78, 78, ""), (79, 79, "centipede"),
    (80, 83, "bird"), (84, 84, "peacock"), (85, 86, "bird"), (87, 90, "parrot"), (91, 96, "bird"),
    (97, 98, "duck"), (99, 99, "goose"), (100, 100, "swan"), (101, 101, "elephant"), (102, 102, "hedgehog"),
    (103, 103, "platypus"), (104, 104, "kangaroo"), (105, 105, "koala"), (106, 106, "wombat"),
    (107, 107, "jellyfish"), (108, 111, ""), (112, 112, "shell"), (113, 113, "snail"), (114, 115, "slug"),
    (116, 117, "shell"), (118, 121, "crab"), (122, 124, "lobster"), (125, 125, "crab"), (126, 126, ""),
    (127, 144, "bird"), (145, 145, "penguin"), (146, 146, "bird"), (147, 148, "whale"), (149, 149, ""),
    (150, 150, "seal"), (151, 275, "dog"), (269, 272, "wolf"), (276, 276, "hyena"), (277, 280, "fox"),
    (281, 285, "cat"), (286, 287, "wildcat"), (288, 290, "leopard"), (291, 291, "lion"), (292, 292, "tiger"),
    (293, 293, "cheetah"), (294, 297, "bear"), (298, 299, "meerkat"), (300, 307, "beetle"), (301, 301, "ladybug"),
    (308, 308, "fly"), (309, 309, "bee"), (310, 310, "ant"), (311, 312, "grasshopper"), (313, 318, "insect"),
    (314, 314, "cockroach"), (319, 320, "dragonfly"), (321, 326, "butterfly"), (327, 327, "starfish"),
    (328, 329, ""), (330, 332, "rabbit"), (333, 333, "hamster"), (334, 334, "hedgehog"), (335, 335, "squirrel"),
    (336, 336, "marmot"), (337, 337, "beaver"), (338, 338, "guinea pig"), (339, 339, "horse"), (340, 340, "zebra"),
    (341, 343, "pig"), (344, 344, "hippo"), (345, 345, "cow"), (346, 347, "buffalo"), (348, 349, "sheep"),
    (350, 350, "goat"), (351, 353, "antelope"), (354, 354, "camel"), (355, 355, "llama"), (356, 359, "ferret"),
    (360, 360, "otter"), (361, 361, "skunk"), (362, 362, "badger"), (363, 363, "armadillo"), (364, 364, "sloth"),
    (365, 365, "ape"), (366, 366, "gorilla"), (367, 367, "chimpanzee"), (368, 382, "monkey"), (383, 384, "lemur"),
    (385, 386, "elephant"), (387, 387, "red panda"), (388, 388, "panda"), (389, 397, "fish"),
]

# The hand review: objects and food a robot's camera meets, named as a person asking a robot would.
# '' : no noun (a user would not ask for it by that name, or the class is a place or a texture).
HAND = {
    400: "gown", 401: "accordion", 402: "guitar", 403: "ship", 404: "airplane", 405: "airship", 406: "",
    407: "ambulance", 408: "", 409: "clock", 410: "", 411: "apron", 412: "trash can", 413: "rifle",
    414: "backpack", 415: "bakery", 416: "", 417: "balloon", 418: "pen", 419: "plaster", 421: "railing",
    422: "barbell", 423: "chair", 424: "", 425: "barn", 427: "barrel", 428: "wheelbarrow", 429: "baseball",
    430: "basketball", 431: "crib", 433: "swimming cap", 434: "towel", 435: "bathtub", 436: "car",
    437: "lighthouse", 439: "hat", 440: "bottle", 441: "glass", 442: "", 443: "bib", 444: "bicycle",
    445: "bikini", 446: "binder", 447: "binoculars", 448: "birdhouse", 449: "boathouse", 450: "sled",
    451: "tie", 452: "hat", 453: "bookcase", 454: "bookshop", 455: "bottle cap", 456: "bow", 457: "bow tie",
    458: "plaque", 459: "bra", 460: "breakwater", 461: "armour", 462: "broom", 463: "bucket", 464: "buckle",
    465: "vest", 466: "train", 467: "butcher shop", 468: "car", 469: "cauldron", 470: "candle", 471: "cannon",
    472: "canoe", 473: "can opener", 474: "cardigan", 475: "mirror", 476: "carousel", 477: "tool kit",
    478: "box", 479: "wheel", 480: "cash machine", 481: "cassette", 482: "cassette player", 483: "castle",
    484: "boat", 485: "CD player", 486: "cello", 487: "phone", 488: "chain", 489: "fence", 490: "armour",
    491: "chainsaw", 492: "chest", 493: "drawers", 494: "bell", 495: "cabinet", 496: "stocking",
    497: "church", 498: "cinema", 499: "knife", 500: "", 501: "cloak", 502: "shoe", 503: "cocktail shaker",
    504: "mug", 505: "coffee pot", 506: "spring", 507: "lock", 508: "keyboard", 509: "sweet shop", 510: "ship",
    511: "car", 512: "bottle opener", 513: "trumpet", 514: "boot", 515: "hat", 516: "cradle", 517: "crane",
    518: "helmet", 519: "crate", 520: "crib", 521: "slow cooker", 522: "ball", 523: "crutch", 524: "armour",
    525: "dam", 526: "desk", 527: "computer", 528: "telephone", 529: "nappy", 530: "clock", 531: "watch",
    532: "table", 533: "dishcloth", 534: "dishwasher", 535: "brake", 536: "dock", 537: "sled", 538: "dome",
    539: "doormat", 540: "oil rig", 541: "drum", 542: "drumstick", 543: "dumbbell", 544: "pot", 545: "fan",
    546: "guitar", 547: "train", 548: "TV cabinet", 549: "envelope", 550: "coffee machine", 551: "face powder",
    552: "scarf", 553: "filing cabinet", 554: "boat", 555: "fire engine", 556: "fire screen", 557: "flagpole",
    558: "flute", 559: "chair", 560: "helmet", 561: "forklift", 562: "fountain", 563: "pen", 564: "bed",
    565: "train", 566: "horn", 567: "frying pan", 568: "coat", 569: "truck", 570: "gas mask", 571: "petrol pump",
    572: "glass", 573: "kart", 574: "golf ball", 575: "golf cart", 576: "gondola", 577: "gong", 578: "gown",
    579: "piano", 580: "greenhouse", 581: "grille", 582: "shop", 583: "guillotine", 584: "hair clip",
    585: "hair spray", 586: "truck", 587: "hammer", 588: "basket", 589: "hair dryer", 590: "phone",
    591: "handkerchief", 592: "hard disk", 593: "harmonica", 594: "harp", 595: "harvester", 596: "axe",
    597: "holster", 598: "television", 599: "honeycomb", 600: "hook", 601: "skirt", 602: "", 603: "cart",
    604: "hourglass", 605: "iPod", 606: "iron", 607: "pumpkin", 608: "jeans", 609: "car", 610: "T-shirt",
    611: "jigsaw puzzle", 612: "rickshaw", 613: "joystick", 614: "kimono", 615: "knee pad", 616: "knot",
    617: "lab coat", 618: "ladle", 619: "lamp", 620: "laptop", 621: "lawn mower", 622: "lens cap",
    623: "knife", 624: "library", 625: "boat", 626: "lighter", 627: "car", 628: "ship", 629: "lipstick",
    630: "shoe", 631: "lotion", 632: "speaker", 633: "magnifier", 634: "sawmill", 635: "compass",
    636: "bag", 637: "mailbox", 638: "swimsuit", 639: "swimsuit", 640: "manhole cover", 641: "maraca",
    642: "xylophone", 643: "mask", 644: "match", 645: "maypole", 646: "maze", 647: "measuring cup",
    648: "cabinet", 649: "standing stone", 650: "microphone", 651: "microwave", 652: "uniform", 653: "milk can",
    654: "minibus", 655: "skirt", 656: "car", 657: "missile", 658: "mitten", 659: "bowl", 660: "mobile home",
    661: "car", 662: "modem", 663: "monastery", 664: "monitor", 665: "scooter", 666: "mortar",
    667: "graduation cap", 668: "mosque", 669: "mosquito net", 670: "scooter", 671: "bicycle", 672: "tent",
    673: "mouse", 674: "trap", 675: "van", 676: "muzzle", 677: "nail", 678: "neck brace", 679: "necklace",
    680: "baby bottle", 681: "laptop", 682: "obelisk", 683: "oboe", 684: "ocarina", 685: "", 686: "oil filter",
    687: "organ", 688: "oscilloscope", 689: "skirt", 690: "cart", 691: "oxygen mask", 692: "packet",
    693: "paddle", 694: "paddle wheel", 695: "padlock", 696: "paintbrush", 697: "pyjamas", 698: "palace",
    699: "pan pipes", 700: "paper towel", 701: "parachute", 702: "", 703: "bench", 704: "parking meter",
    705: "train", 706: "patio", 707: "payphone", 708: "pedestal", 709: "pencil case", 710: "pencil sharpener",
    711: "perfume", 712: "petri dish", 713: "photocopier", 714: "plectrum", 715: "helmet", 716: "fence",
    717: "truck", 718: "pier", 719: "piggy bank", 720: "pill bottle", 721: "pillow", 722: "ball",
    723: "pinwheel", 724: "ship", 725: "jug", 726: "plane", 727: "planetarium", 728: "plastic bag",
    729: "plate rack", 730: "plough", 731: "plunger", 732: "camera", 733: "pole", 734: "van", 735: "poncho",
    736: "pool table", 737: "bottle", 738: "flowerpot", 739: "wheel", 740: "drill", 741: "rug",
    742: "printer", 743: "prison", 744: "missile", 745: "projector", 746: "puck", 747: "punching bag",
    748: "purse", 749: "quill", 750: "quilt", 751: "car", 752: "racket", 753: "radiator", 754: "radio",
    755: "radio telescope", 756: "barrel", 757: "camper van", 758: "reel", 759: "camera", 760: "fridge",
    761: "remote control", 762: "restaurant", 763: "revolver", 764: "rifle", 765: "chair", 766: "rotisserie",
    767: "eraser", 768: "rugby ball", 769: "ruler", 770: "shoe", 771: "safe", 772: "safety pin",
    773: "salt shaker", 774: "sandal", 775: "sarong", 776: "saxophone", 777: "scabbard", 778: "scale",
    779: "bus", 780: "ship", 781: "scoreboard", 782: "screen", 783: "screw", 784: "screwdriver",
    785: "seat belt", 786: "sewing machine", 787: "shield", 788: "shoe shop", 789: "screen", 790: "basket",
    791: "shopping cart", 792: "shovel", 793: "shower cap", 794: "shower curtain", 795: "ski", 796: "ski mask",
    797: "sleeping bag", 798: "slide rule", 799: "door", 800: "slot machine", 801: "snorkel",
    802: "snowmobile", 803: "snowplough", 804: "soap dispenser", 805: "football", 806: "sock",
    807: "solar panel", 808: "sombrero", 809: "bowl", 810: "keyboard", 811: "heater", 812: "space shuttle",
    813: "spatula", 814: "boat", 815: "spider web", 816: "spindle", 817: "car", 818: "spotlight", 819: "stage",
    820: "train", 821: "bridge", 822: "steel drum", 823: "stethoscope", 824: "scarf", 825: "wall",
    826: "stopwatch", 827: "stove", 828: "sieve", 829: "tram", 830: "stretcher", 831: "sofa", 832: "stupa",
    833: "submarine", 834: "suit", 835: "sundial", 836: "sunglasses", 837: "sunglasses", 838: "sunscreen",
    839: "bridge", 840: "mop", 841: "sweatshirt", 842: "swimming trunks", 843: "swing", 844: "switch",
    845: "syringe", 846: "lamp", 847: "tank", 848: "tape player", 849: "teapot", 850: "teddy bear",
    851: "television", 852: "tennis ball", 853: "thatched roof", 854: "curtain", 855: "thimble",
    856: "thresher", 857: "throne", 858: "roof", 859: "toaster", 860: "tobacco shop", 861: "toilet",
    862: "torch", 863: "totem pole", 864: "tow truck", 865: "toyshop", 866: "tractor", 867: "truck",
    868: "tray", 869: "coat", 870: "tricycle", 871: "boat", 872: "tripod", 873: "arch", 874: "bus",
    875: "trombone", 876: "tub", 877: "turnstile", 878: "typewriter", 879: "umbrella", 880: "unicycle",
    881: "piano", 882: "vacuum cleaner", 883: "vase", 884: "vault", 885: "", 886: "vending machine",
    887: "", 888: "viaduct", 889: "violin", 890: "volleyball", 891: "waffle", 892: "clock", 893: "wallet",
    894: "wardrobe", 895: "airplane", 896: "sink", 897: "washing machine", 898: "water bottle", 899: "jug",
    900: "water tower", 901: "jug", 902: "whistle", 903: "wig", 904: "window", 905: "blind", 906: "tie",
    907: "bottle", 908: "airplane", 909: "wok", 910: "wooden spoon", 911: "wool", 912: "fence", 913: "wreck",
    914: "boat", 915: "yurt", 916: "website", 917: "comic book", 918: "crossword", 919: "street sign",
    920: "traffic light", 921: "book", 922: "menu", 923: "plate", 924: "dip", 925: "soup", 926: "hot pot",
    927: "trifle", 928: "ice cream", 929: "ice lolly", 930: "bread", 931: "bagel", 932: "pretzel",
    933: "burger", 934: "hot dog", 935: "mashed potato", 936: "cabbage", 937: "broccoli", 938: "cauliflower",
    939: "courgette", 940: "squash", 941: "squash", 942: "squash", 943: "cucumber", 944: "artichoke",
    945: "pepper", 946: "", 947: "mushroom", 948: "apple", 949: "strawberry", 950: "orange", 951: "lemon",
    952: "fig", 953: "pineapple", 954: "banana", 955: "jackfruit", 956: "custard apple", 957: "pomegranate",
    958: "hay", 959: "pasta", 960: "chocolate sauce", 961: "dough", 962: "meatloaf", 963: "pizza", 964: "pie",
    965: "burrito", 966: "wine", 967: "coffee", 968: "cup", 969: "eggnog", 970: "mountain", 971: "bubble",
    972: "cliff", 973: "coral reef", 974: "geyser", 975: "lake", 976: "headland", 977: "sandbar", 978: "beach",
    979: "valley", 980: "volcano", 981: "baseball player", 982: "groom", 983: "diver", 984: "", 985: "daisy",
    986: "flower", 987: "corn", 988: "acorn", 989: "rose hip", 990: "conker", 991: "", 992: "mushroom",
    993: "mushroom", 994: "mushroom", 995: "mushroom", 996: "mushroom", 997: "mushroom", 998: "", 999: "toilet paper",
}


def draft(classes: list[str]) -> list[str]:
    """One noun ('' for none) per class, by RANGES (later ranges override earlier ones), else HAND, else the
    class's first synonym in lower case."""
    nouns = [c.split(",")[0].strip().lower() for c in classes]
    for first, last, noun in RANGES:
        nouns[first : last + 1] = [noun] * (last - first + 1)
    for i, noun in HAND.items():
        nouns[i] = noun
    return nouns


def main() -> None:
    src = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(sys.prefix) / "share/opencv-doc/examples/data/dnn/classification_classes_ILSVRC2012.txt"
    classes = src.read_text().splitlines()
    assert len(classes) == 1000, len(classes)
    print("index\tclass\tnoun")
    for i, (cls, noun) in enumerate(zip(classes, draft(classes))):
        print(f"{i}\t{cls.split(',')[0].strip()}\t{noun}")


if __name__ == "__main__":
    main()
