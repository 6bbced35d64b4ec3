"""The exemplar memory bank: in RAM, the fixed-row store on disk, approximate search."""
