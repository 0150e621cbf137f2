package diff

// explained maps differences to the entries of ../DIFFERENCES.md; see explanation.
var explained = []explanation{}
