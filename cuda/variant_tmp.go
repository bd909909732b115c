package cuda

// perfVariant selects launch variants side by side in the operator
// benchmark (EMBER_VARIANT; temporary, removed with the losers): bit 0 an
// uncapped grid for the softmax rows, bit 1 batch-norm parts of half the
// size.
var perfVariant int
